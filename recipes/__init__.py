"""idmix's torchtune recipes (``tune run recipes/<name>.py --config recipes/configs/<c>.yaml``).

Nothing imports from this package: each recipe is a leaf over ``idmix``. It is a package only
because ``tune run`` runs a recipe as the module ``recipes.<name>``; torchtune installs a
top-level package also named ``recipes``, and the start-up hook in ``tools/recipes-hook``
(installed by the README's set-up command) makes this folder win when the working directory is
the repository root. See docs/design.md §9."""

"""idmix's torchtune recipes (``tune run recipes/<name>.py --config recipes/configs/<c>.yaml``).

torchtune installs a top-level package also named ``recipes``; the start-up hook in
``tools/recipes-hook`` (installed by the README's set-up command) makes this folder win when
the working directory is the repository root. See docs/design.md §9."""

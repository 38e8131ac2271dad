"""Only what pyproject.toml cannot declare: ship ``idmix-recipes.pth`` at the root of
site-packages (see ``_idmix_recipes.py``). Install this project non-editable (an editable
install would not place the .pth where the interpreter reads it)."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "idmix-recipes.pth"


class BuildWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file(str(Path(__file__).parent / PTH), str(Path(self.build_lib) / PTH))

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PTH)]

    def get_output_mapping(self):
        mapping = dict(super().get_output_mapping())
        mapping[str(Path(self.build_lib) / PTH)] = str(Path(__file__).parent / PTH)
        return mapping


setup(cmdclass={"build_py": BuildWithPth})

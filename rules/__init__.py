# This folder is installed as the package servlens.builtin_rules (see pyproject.toml), so the rule files ship in the
# wheel and are found with importlib.resources from any working directory.

"""Helpers shared by every test folder, imported by name (`from support.cli import run_cli`).

pyproject.toml's [tool.pytest.ini_options] `pythonpath = ["tests"]` puts this package on sys.path;
conftest.py files hold fixtures only and are never imported by path.
"""

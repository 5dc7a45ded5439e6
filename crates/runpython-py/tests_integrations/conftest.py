"""Shared by the integrations' tests. Each framework's directory runs in a venv of its own, with the wheel
and that extra installed (`cargo xtask integrations`); nothing at this level imports a framework. This
file's directory is on sys.path through it, so the tests import `sandbox_png`."""

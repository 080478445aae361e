"""Root conftest: plugins our own tests use (pytester for the plugin tests)."""

pytest_plugins = ["pytester"]

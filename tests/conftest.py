"""Fixtures shared across the test folders."""

import pytest
from wheel_support import InstalledWheel, build_and_install


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory) -> InstalledWheel:
    """The checkout built as a wheel and installed into a folder outside it (once per session)."""
    return build_and_install(tmp_path_factory.mktemp("installed-wheel"))

"""The tool tests use the root conftest's ``nsqd`` fixture and nsqtw's pytest plugin fixtures.

The plugin is loaded by its ``pytest11`` entry point once nsqtw is installed;
from a bare checkout it is not, so its fixtures are imported here (a
conftest's fixtures win over a plugin's of the same name, so both ways work).
"""

from nsqtw.testing.pytest_plugin import (  # noqa: F401
    nsqtw_cluster, nsqtw_lookupd, nsqtw_nsqd, nsqtw_nsqd_factory, pytest_configure,
)

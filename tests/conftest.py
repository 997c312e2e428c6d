"""Fixtures every test module may ask for by name (defined in tests/support/).

- ``job_factory`` (:mod:`tests.support.jobs`): start ``gflowdist run`` jobs,
  each killed, whatever happened, when the test ends;
- ``netns_hosts`` (:mod:`tests.support.netns`): two network-namespace hosts
  for a module (skipped with the reason where namespaces are unavailable).
"""

from tests.support.jobs import job_factory  # noqa: F401 (a fixture)
from tests.support.netns import netns_hosts  # noqa: F401 (a fixture)

"""Each of several processes side by side gets its share of the cores for torch's threads."""

from __future__ import annotations

import os

from prefshift.core.host import core_share


def test_the_cores_this_process_may_use_are_shared_out_and_no_process_gets_none():
    cores = len(os.sched_getaffinity(0))
    assert core_share(1) == cores
    assert core_share(cores) == 1
    assert core_share(cores + 1) == 1, "more processes than cores: one thread each, not zero"
    assert core_share(2) == max(1, cores // 2)

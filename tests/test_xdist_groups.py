"""The suite's heavy shared fixtures (the report run, the distributed spawns, the compile
batches) are session-scoped and kept on one pytest-xdist worker by `xdist_group` marks.
Where pytest and pytest-xdist disagree on how a node's id is kept (pytest 9.2 with
pytest-xdist 3.8), the marks are silently lost and every worker builds those fixtures
again: minutes of CI, with every test still passing. This test fails instead."""

import pytest

pytestmark = pytest.mark.xdist_group("grouping-check")


def test_xdist_group_marks_reach_the_scheduler(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by a pytest-xdist worker under --dist loadgroup")
    assert request.node.nodeid.endswith("@grouping-check"), (
        f"{request.node.nodeid}: the xdist_group mark was not added to the node id, so "
        "loadgroup spreads grouped tests over workers (pytest and pytest-xdist versions "
        "that do not work together: see pyproject.toml's dev extra)")

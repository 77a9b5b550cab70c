"""ResourceOptions through the C ABI: the layout of callers built before a
field was added still works, a size of no released layout is refused, and
graph_safe maps to rmmd_capture_checks."""

from __future__ import annotations

import ctypes

import pytest

import rmmd
from rmmd import _lib
from rmmd._errors import check
from rmmd._resource import capture_checks_value


def _create(session: rmmd.Session, size: int) -> int:
    lib = _lib.load()
    options = _lib.ResourceOptions(size=size, kind=_lib.RESOURCE_HOST, device=-1, pool=None, mode=_lib.MODE_SLAB)
    handle = _lib.resource_t()
    status = lib.rmmd_resource_create(session._require(), ctypes.byref(options), ctypes.byref(handle))
    if status == 0:
        check(lib.rmmd_resource_destroy(handle))
    return status


def test_the_layout_before_capture_checks_still_makes_a_resource(session: rmmd.Session) -> None:
    assert _create(session, _lib.ResourceOptions.capture_checks.offset) == 0
    assert _create(session, ctypes.sizeof(_lib.ResourceOptions)) == 0


def test_a_size_of_no_released_layout_is_refused(session: rmmd.Session) -> None:
    status = _create(session, _lib.ResourceOptions.capture_checks.offset + 1)
    assert status != 0
    with pytest.raises(rmmd.InvalidArgumentError, match="size"):
        check(status)


def test_graph_safe_maps_to_capture_checks() -> None:
    assert capture_checks_value(None) == _lib.CAPTURE_CHECKS_AUTOMATIC
    assert capture_checks_value(True) == _lib.CAPTURE_CHECKS_EVERY_CALL
    assert capture_checks_value(False) == _lib.CAPTURE_CHECKS_SLOW_PATH_ONLY
    with pytest.raises(rmmd.InvalidArgumentError, match="graph_safe"):
        capture_checks_value("yes")  # type: ignore[arg-type]

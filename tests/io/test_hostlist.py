"""Slurm hostlist expand/compress properties."""

from __future__ import annotations

import pytest
from gpuplace._util.hostlist import HostlistError, compress, expand
from hypothesis import given, settings
from hypothesis import strategies as st

NAMES = st.lists(
    st.builds(
        lambda prefix, number, width: f"{prefix}{str(number).zfill(width)}",
        st.sampled_from(["dgx", "n", "switch.2.", "gpu-a", "r1n", ""]),
        st.integers(0, 2000),
        st.integers(0, 4),
    ).filter(bool),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(NAMES)
def test_expand_compress_round_trip(names):
    assert set(expand(compress(names))) == set(names)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["login", "head-node", "x.y"]), max_size=5), NAMES)
def test_plain_names_survive(plain, names):
    assert set(expand(compress(plain + names))) == set(plain + names)


def test_examples():
    assert expand("dgx[001-003,010]") == ["dgx001", "dgx002", "dgx003", "dgx010"]
    assert expand("switch.2.[1-3]") == ["switch.2.1", "switch.2.2", "switch.2.3"]
    assert expand("r[1-2]n[01-02]") == ["r1n01", "r1n02", "r2n01", "r2n02"]
    assert compress(["switch.1.9", "switch.1.10", "switch.1.11"]) == "switch.1.[9-11]"


@pytest.mark.parametrize("bad", ["n[1-1000000000]", "n[3-1]", "n[1", "n]", "n[a-b]", "n[[1]]"])
def test_bad_expressions(bad):
    with pytest.raises(HostlistError):
        expand(bad)

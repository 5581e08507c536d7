import os

import numpy as np
import pytest
from hypothesis import settings

from hbmsim.algorithms.workload import AttentionData
from hbmsim.simulator import GPU, load_gpu
from hbmsim.scenarios.experiment import HARDWARE_DIR
from hbmsim.scenarios.explain import default_example

# Hypothesis draws new random examples on every run (the fuzz tests' point) unless
# HYPOTHESIS_PROFILE=ci (.ci/run sets it): then each test's examples come from a seed fixed by
# the test, so that CI passes or fails the same way on every clone.
settings.register_profile("ci", derandomize=True, database=None)

# validate's cache of finished simulations (scenarios/sim_cache.py) is off in the
# tests, in this process and the ones it starts: a test that changes a program or the model in
# place must simulate, not read what another test left (tests/test_validate.py checks the cache)
os.environ["HBMSIM_NO_CACHE"] = "1"


def pytest_configure(config):
    profile = os.environ.get("HYPOTHESIS_PROFILE", "default")
    if profile not in ("default", "ci"):
        raise pytest.UsageError(f"HYPOTHESIS_PROFILE = {profile!r}: must be 'default' or 'ci' (tests/conftest.py)")
    settings.load_profile(profile)

# The worked 4 x 4 example (README: What the demo shows), defined once: `hbmsim explain`'s default
# example (scenarios/explain.py). Its V is 1..16; its O, worked out by hand to 2 decimals:
SEED_V = default_example().v
SEED_O = np.array([[7.20, 8.20, 9.20, 10.20], [9.88, 10.88, 11.88, 12.88],
                   [6.08, 7.08, 8.08, 9.08], [7.92, 8.92, 9.92, 10.92]])


def tiny_gpu(**over) -> GPU:
    """A small made-up GPU for fast unit tests (not a preset: numbers chosen for easy arithmetic)."""
    spec = dict(name="tiny", sm_count=4, clock_hz=1e9, hbm_bytes_per_s=1e11, hbm_latency_s=1e-7,
                hbm_capacity_bytes=10**10, sram_bytes_per_sm=65536, sram_bytes_per_s_per_sm=1e11,
                matmul_flops_per_s=4e12, vector_flops_per_s=4e11, l2_bytes=0, l2_bytes_per_s=0.0,
                max_blocks_per_sm=8)
    spec.update(over)
    return GPU(**spec)


@pytest.fixture
def gpu():
    return tiny_gpu()


@pytest.fixture(scope="session")
def a100():
    return load_gpu(HARDWARE_DIR / "a100-sxm4-40gb.toml")


@pytest.fixture(scope="session")
def h100():
    return load_gpu(HARDWARE_DIR / "h100-sxm5-80gb.toml")


@pytest.fixture(scope="session")
def h200():
    return load_gpu(HARDWARE_DIR / "h200-sxm-141gb.toml")


@pytest.fixture
def seed():
    """The worked 4 x 4 example: Q, K, V = 1..16, dO, scale 1, blocks of 2 (an explain.Example)."""
    return default_example()


def seed_case(dtype="fp32"):
    """(workload, forward data without dO) of the worked example, fresh arrays each call."""
    ex = default_example(dtype=dtype)
    return ex.workload(), AttentionData(ex.q[None, None], ex.k[None, None], ex.v[None, None])


def grouped(workloads):
    """A hypothesis strategy of workloads with kv_heads drawn from the divisors of heads (heads:
    multi-head, 1: multi-query, between: grouped-query), from a strategy of workloads."""
    import dataclasses

    from hypothesis import strategies as st

    return workloads.flatmap(lambda wl: st.sampled_from([k for k in range(1, wl.heads + 1) if wl.heads % k == 0])
                             .map(lambda k: dataclasses.replace(wl, kv_heads=k)))


def grouped_fields(fields):
    """As grouped, for a strategy of Workload keyword dicts: adds a "kv_heads" dividing "heads"."""
    from hypothesis import strategies as st

    return fields.flatmap(lambda f: st.sampled_from([k for k in range(1, f["heads"] + 1) if f["heads"] % k == 0])
                          .map(lambda k: {**f, "kv_heads": k}))


def counted_by_tensor(result) -> dict:
    """{tensor: (L2-side read bytes, write bytes)} a simulated result counted, zeros left out."""
    out: dict = {}
    for k in result.kernels:
        for name, t in k.tensors.items():
            r, w = out.get(name, (0, 0))
            out[name] = (r + t.read, w + t.write)
    return {k: v for k, v in out.items() if v != (0, 0)}


def nonzero(io: dict) -> dict:
    """A closed form's {tensor: (read, write)} without its zero entries."""
    return {k: v for k, v in io.items() if v != (0, 0)}

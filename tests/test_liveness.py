"""Liveness: every request to the HBM pool finishes, in a bounded number of events, whatever the
rates and sizes; and every random program finishes on machines whose rates span many orders of
magnitude, with its counters equal to what it issued.

The pool used to hang at 100% CPU: a wake-up at time `now` left 4.9e-12 bytes of a 4-byte load
unserved, whose remaining time (1.5e-24 s) added to now = 1.5e-8 s gave now again, so it re-armed
itself at `now` forever. These tests drive the pool and the machine far outside the presets'
rates (1e-20 .. 1e20 per second) so any such zero-progress loop shows up as a failure, not a hang:
the machine runs with `max_events` and the pool is stepped event by event with a cap.
"""
import math

import pytest
import simpy
from hypothesis import given, settings, strategies as st

from hbmsim.simulator import HbmsimError, Launch, Machine, Program, Tensor
from hbmsim.simulator.resources import SharedPool

from conftest import tiny_gpu

rates = st.floats(-20, 20).map(lambda x: 10.0 ** x)


def fluid_finish_times(rate: float, requests: list) -> list:
    """Processor sharing computed directly (no virtual clock): requests [(arrival_s, amount)]."""
    order = sorted(range(len(requests)), key=lambda i: requests[i][0])
    remaining, finish, now, k = {}, [0.0] * len(requests), 0.0, 0
    while k < len(order) or remaining:
        next_arrival = requests[order[k]][0] if k < len(order) else math.inf
        if remaining:
            share = rate / len(remaining)
            first = min(remaining, key=remaining.get)
            done_at = now + remaining[first] / share
            if done_at <= next_arrival:
                for i in remaining:
                    remaining[i] -= (done_at - now) * share
                now = done_at
                finish[first] = now
                del remaining[first]
                continue
            for i in remaining:
                remaining[i] -= (next_arrival - now) * share
        now = next_arrival
        i = order[k]
        remaining[i] = requests[i][1]
        k += 1
    return finish


@settings(max_examples=300, deadline=None)
@given(rates, st.lists(st.tuples(st.sampled_from([0.0, 1e-12, 1e-9, 1.0]) | st.floats(0, 1e3),
                                 st.floats(-6, 12).map(lambda x: 10.0 ** x)), min_size=1, max_size=12),
       st.sampled_from([0.0, 1e-7]))
def test_shared_pool_always_finishes_in_bounded_events(rate, requests, latency):
    env = simpy.Environment()
    pool = SharedPool(env, rate, latency)
    done = {}

    def client(i, at, amount):
        yield env.timeout(at)
        yield pool.request(amount)
        done[i] = env.now

    for i, (at, amount) in enumerate(requests):
        env.process(client(i, at, amount))
    # Each client costs 4 events of its own (start, timeout, completion, end); the pool at most
    # 3 per request (its wake-up, a re-arm, and one superseded wake-up).
    cap = 7 * len(requests) + 2
    for _ in range(cap):
        if env.peek() == math.inf:
            break
        env.step()
    assert env.peek() == math.inf, f"pool still busy after {cap} events"
    assert len(done) == len(requests)
    assert pool.wakes <= 2 * pool.requests
    expected = fluid_finish_times(rate, requests)
    for i in range(len(requests)):
        # Within float rounding: a request is finished when its remaining time is below one ulp
        # of the clock, and the virtual clock rounds relative to the work in flight.
        assert done[i] == pytest.approx(expected[i] + latency, rel=1e-9, abs=1e-300)


def test_shared_pool_issue7_hang():
    """The hanging case itself: a 4-byte load arriving after other traffic at 3.35 TB/s."""
    env = simpy.Environment()
    pool = SharedPool(env, 3.35e12, 0.0)
    finished = []

    def client(at, amount):
        yield env.timeout(at)
        yield pool.request(amount)
        finished.append(env.now)

    env.process(client(0.0, 51138.0))
    env.process(client(1.5265524836519945e-08 - 1.46e-24, 4.0))
    for _ in range(40):
        if env.peek() == math.inf:
            break
        env.step()
    assert len(finished) == 2


# ---- random programs on machines with extreme rates ---------------------------------------------

@st.composite
def machines(draw):
    l2 = draw(st.sampled_from([0, 0, 2048, 1 << 20]))
    return tiny_gpu(sm_count=draw(st.integers(1, 6)), hbm_bytes_per_s=draw(rates), hbm_latency_s=draw(rates) * 1e-25,
                    matmul_flops_per_s=draw(rates), vector_flops_per_s=draw(rates),
                    sram_bytes_per_s_per_sm=draw(rates), l2_bytes=l2, l2_bytes_per_s=draw(rates) if l2 else 0.0,
                    max_blocks_per_sm=draw(st.integers(1, 4)))


@st.composite
def programs(draw):
    """Launches of blocks that load, prefetch, store, atomically add and compute random tiles of
    ragged tensors. Returns (program, the calls each block makes, the bytes they read/write)."""
    tensors = [Tensor(f"T{i}", (draw(st.integers(1, 3)), draw(st.integers(1, 70)), draw(st.integers(1, 9))), "fp16",
                      count_only=True) for i in range(draw(st.integers(1, 3)))]

    def tile(t):
        r0 = draw(st.integers(0, t.shape[1] - 1))
        c0 = draw(st.integers(0, t.shape[2] - 1))
        return (t[draw(st.integers(0, t.shape[0] - 1))], slice(r0, draw(st.integers(r0 + 1, t.shape[1]))),
                slice(c0, draw(st.integers(c0 + 1, t.shape[2]))))

    def nbytes(tl):
        return (tl[1].stop - tl[1].start) * (tl[2].stop - tl[2].start) * 2

    launches, expected = [], {t.name: [0, 0] for t in tensors}
    calls = 0
    for k in range(draw(st.integers(1, 3))):
        grid = draw(st.integers(1, 6))
        steps = []
        for _ in range(draw(st.integers(0, 5))):
            kind = draw(st.sampled_from(["load", "load_tiles", "prefetch", "store", "atomic", "compute"]))
            n_tiles = 2 if kind in ("load_tiles", "prefetch") else 1
            tiles = [tile(draw(st.sampled_from(tensors))) for _ in range(n_tiles)]
            flops = tuple(draw(st.sampled_from([0, 1, 10**6, 10**9])) for _ in range(3))
            steps.append((kind, tiles, flops))
            for tl in tiles:
                if kind in ("load", "load_tiles", "prefetch", "atomic"):
                    expected[tl[0].tensor.name][0] += grid * nbytes(tl)
                if kind in ("store", "atomic"):
                    expected[tl[0].tensor.name][1] += grid * nbytes(tl)
        calls += grid * (len(steps) + 1)

        def block(ctx, index, steps=steps):
            for kind, tiles, flops in steps:
                if kind == "load":
                    yield from ctx.load(*tiles[0])
                elif kind == "load_tiles":
                    yield from ctx.load_tiles(*tiles)
                elif kind == "prefetch":
                    handle = ctx.prefetch(*tiles)
                    yield from ctx.compute(*flops)
                    yield from ctx.wait(handle)
                elif kind == "store":
                    yield from ctx.store(*tiles[0])
                elif kind == "atomic":
                    yield from ctx.atomic_add(*tiles[0])
                else:
                    yield from ctx.compute(*flops)
        launches.append(Launch(f"k{k}", grid, draw(st.sampled_from([0, 100, 4096])), block))
    return Program("random", launches, inputs=tuple(tensors)), calls, expected


@settings(max_examples=200, deadline=None)
@given(machines(), programs())
def test_random_programs_finish_with_exact_counters(gpu, prog_calls):
    program, calls, expected = prog_calls
    machine = Machine(gpu)
    # Per context call at most: 2 HBM requests (data + write-back) at 3 events each, a completion,
    # an L2 timeout and a compute timeout; per block slot a process start and end; per launch a
    # few events of its own.
    result = machine.run(program, max_events=12 * calls + 8 * len(program.launches) + 10)
    assert machine.hbm.wakes <= 2 * machine.hbm.requests
    counted = {name: [t.read, t.write] for name, t in result.tensors().items()}
    assert counted == {name: rw for name, rw in expected.items() if rw != [0, 0]}
    assert math.isfinite(result.time_s) and result.time_s >= 0


@pytest.mark.parametrize("field, value", [("hbm_bytes_per_s", 1e-300), ("matmul_flops_per_s", 1e-300),
                                          ("vector_flops_per_s", 1e-300), ("hbm_latency_s", 1e300)])
def test_rates_beyond_float_time_are_one_clear_error(field, value):
    t = Tensor("X", (1, 64, 64), "fp16", count_only=True)

    def block(ctx, index):
        yield from ctx.load(t[0], slice(0, 64), slice(0, 64))
        yield from ctx.compute(10**6, 10**6, 10**3)
    gpu = tiny_gpu(**{field: value})
    with pytest.raises(HbmsimError, match="too long for simulated time") as err:
        Machine(gpu).run(Program("p", [Launch("k", 8, 0, block)], inputs=(t,)))
    assert "\n" not in str(err.value) and field in str(err.value)

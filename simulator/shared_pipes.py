"""pipe_sharing (time_model.py): the tensor pipe and the vector (FP32/SFU) pipe of each SM, for
kernels on Hopper's asynchronous wgmma, as processor-sharing pools shared by the block's warp
roles.

The SM's four warp schedulers interleave the instructions of their resident warps (one warp
instruction per scheduler per cycle, round robin among ready warps: H100 whitepaper, "H100 SM
architecture"), so two warpgroups with GEMMs in flight share the tensor cores rather than taking
turns call by call. A warp issues in order, so one role's requests on a pipe are served one
after another, each entering the pool when the role's previous one there is done. A compute
call is its phases one after another: each GEMM on the tensor pool, then (serial_softmax) its
softmax on the vector pool. Without the effect the machine's FifoPipes serve whole calls first
come, first served (machine.py).

Cost: a call is about four SimPy events (two pool wake-ups, two completions) instead of one.
"""
from __future__ import annotations

from collections import deque

from .resources import SharedPool
from .simpy_adapter import Timer


class SharedPipes:
    """Per SM a tensor and a vector pool (rate 1: work in seconds), and each warp role's queue."""

    def __init__(self, machine, sm_count: int):
        self.m = machine
        env = machine.env
        self.tensor = [SharedPool(env, 1.0, 0.0, f"sm{i}_tensor_ps", True) for i in range(sm_count)]
        self.vector = [SharedPool(env, 1.0, 0.0, f"sm{i}_vector_ps", True) for i in range(sm_count)]
        self._role_queues: dict = {}      # (pool, warp role) -> its requests, the head in flight

    def compute(self, ctx, phases) -> Timer | None:
        """Compute calls (`phases`: (matmul_flops, vector_flops, sram_bytes, exp_ops) each,
        dependent, run one after another) of a wgmma kernel on ctx's SM, counted as the machine
        counts them. Returns the event that fires when the last phase is done (None if there is
        no work)."""
        m = self.m
        rates = m.rates
        tensor_op, vector_work = ctx._launch.tensor_op, ctx._launch.vector_work
        works = []
        for mf, vf, sb, ex in phases:
            k = m.count_compute(ctx, mf, vf, sb, ex)
            t_s, v_s = rates.compute_s(tensor_op, mf, vf, ex, sb, vector_work)
            if t_s or v_s:
                works.append((t_s, v_s, {"matmul_flops": mf, "sram_bytes": sb}, {"vector_flops": vf, "exp_ops": ex}))
        if not works:
            return None
        done = Timer()
        done.callbacks = []
        _SharedCall(self, ctx, k, iter(works), done, m.env.active_process)
        return done

    def busy_s(self, sm: int) -> float:
        """How long SM `sm`'s busier pool has had work in flight so far."""
        now = self.m.env.now
        t, v = self.tensor[sm], self.vector[sm]
        t._advance(now)
        v._advance(now)
        return max(t.busy_s, v.busy_s)

    def request(self, pool: SharedPool, proc, amount: float, then) -> None:
        """`amount` seconds of work on a pool for warp role `proc`, after the role's earlier
        requests there; `then(start_s)` when served (start_s: when it entered the pool)."""
        if proc is None:
            start_s = self.m.env._now
            pool.request(amount).callbacks.append(lambda _ev: then(start_s))
            return
        key = (pool, proc)
        queue = self._role_queues.get(key)
        if queue is None:
            queue = self._role_queues[key] = deque()
        queue.append((amount, then))
        if len(queue) == 1:
            self._issue_head(pool, key, queue)

    def _issue_head(self, pool: SharedPool, key, queue) -> None:
        start_s = self.m.env._now

        def served(_ev):
            _, then = queue.popleft()
            if queue:
                self._issue_head(pool, key, queue)
            else:
                del self._role_queues[key]
            then(start_s)
        pool.request(queue[0][0]).callbacks.append(served)


class _SharedCall:
    """One compute call in flight: its phases, one after another, each GEMM then its softmax (a
    plain object, not closures: no reference cycles for the collector, which is off while the
    machine runs). With a recorder, each part is drawn from when it entered its pipe."""

    __slots__ = ("p", "sm", "name", "block", "role", "works", "done", "proc", "work", "left")

    def __init__(self, pipes: SharedPipes, ctx, k, works, done, proc):
        self.p, self.sm, self.name, self.block, self.role = pipes, ctx.sm, k.name, ctx.block, ctx.role
        self.works, self.done, self.proc = works, done, proc
        self.next_phase()

    def _record(self, start_s: float, work: dict) -> None:
        m = self.p.m
        if m.recorder is not None:
            m.recorder.compute(self.sm, self.name, self.block, start_s, m.env._now, work, role=self.role)

    def next_phase(self, start_s: float | None = None) -> None:
        """The previous phase's softmax (if any) is done: start the next phase, or finish."""
        p = self.p
        if start_s is not None:
            self._record(start_s, self.work[3])
        w = self.work = next(self.works, None)
        if w is None:
            done = self.done
            callbacks, done.callbacks = done.callbacks, None     # processed now (as Inline is)
            for callback in callbacks:
                callback(done)
            return
        t_s, v_s = w[0], w[1]
        if p.m.rates.serial:                  # the softmax needs the GEMM's S
            if t_s:
                p.request(p.tensor[self.sm], self.proc, t_s, self.after_tensor)
            else:
                p.request(p.vector[self.sm], self.proc, v_s, self.next_phase)
        else:
            self.left = (1 if t_s else 0) + (1 if v_s else 0)
            if t_s:
                p.request(p.tensor[self.sm], self.proc, t_s, self.tensor_done)
            if v_s:
                p.request(p.vector[self.sm], self.proc, v_s, self.vector_done)

    def after_tensor(self, start_s: float) -> None:
        self._record(start_s, self.work[2])
        if self.work[1]:
            self.p.request(self.p.vector[self.sm], self.proc, self.work[1], self.next_phase)
        else:
            self.next_phase()

    def tensor_done(self, start_s: float) -> None:
        self._record(start_s, self.work[2])
        self._one_done()

    def vector_done(self, start_s: float) -> None:
        self._record(start_s, self.work[3])
        self._one_done()

    def _one_done(self) -> None:
        self.left -= 1
        if not self.left:
            self.next_phase()

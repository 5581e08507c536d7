"""simulator/simpy_adapter.py's lighter stand-ins schedule exactly what SimPy's own would: the
same events in the same order at the same times, so that a run's results do not depend on which
is used. Each check runs one scenario twice, once with SimPy's Process, Event and run and once
with Role, Flag and run, and compares what happened, step by step."""
import pytest
import simpy

from hbmsim.simulator.simpy_adapter import Role, events_scheduled, flags, run

# Three roles of one "block": a producer that fills two buffers a microsecond apart, and two
# consumers that wait for each buffer, take their turn, and hand the turn on (FA3's ping-pong);
# a joiner waits for all three and gets the producer's return value.
STEP_S = 1e-6


def scenario(env, spawn, make_flag, log):
    full = [make_flag() for _ in range(2)]
    turn = [make_flag(), make_flag()]

    def producer():
        for i in range(2):
            yield env.timeout(STEP_S)
            log.append((env.now, "fill", i))
            full[i].succeed()
        return "filled"

    def consumer(w):
        for i in range(2):
            yield full[i]
            if w == 1 or i > 0:
                yield turn[w]
            log.append((env.now, "consume", w, i))
            yield env.timeout(STEP_S / 2)
            turn[w] = make_flag()
            turn[1 - w].succeed()
        yield full[0]                       # processed long ago: goes on at once
        log.append((env.now, "done", w))

    def waiter(flag):
        yield flag
        log.append((env.now, "released"))

    def starter():
        log.append((env.now, "started"))
        yield env.timeout(0)

    def joiner():
        roles = [spawn(producer())] + [spawn(consumer(w)) for w in range(2)]
        released = make_flag()
        spawn(waiter(released))
        yield env.timeout(STEP_S / 4)
        released.succeed()                  # its waiter resumes after a role started now (urgent)
        spawn(starter())
        value = yield roles[0]
        log.append((env.now, "joined producer", value))
        for role in roles[1:]:
            yield role
        log.append((env.now, "joined all"))

    spawn(joiner())


def simulate(light: bool):
    env = simpy.Environment()
    log = []
    if light:
        scenario(env, lambda g: Role(env, g), flags(env), log)
        run(env)
    else:
        scenario(env, env.process, env.event, log)
        env.run()
    return log, env.now, events_scheduled(env)


def test_role_flag_and_run_schedule_what_simpy_does():
    light, simpy_own = simulate(True), simulate(False)
    assert light == simpy_own
    log, now, _ = light
    # by hand: the fills at 1 and 2 us; consumer 0 first at 1 us, consumer 1 after it at 1.5 us, ...
    assert log[:2] == [(STEP_S / 4, "started"), (STEP_S / 4, "released")]
    assert [entry[:2] for entry in log[2:5]] == [(STEP_S, "fill"), (STEP_S, "consume"), (1.5 * STEP_S, "consume")]
    assert (2 * STEP_S, "joined producer", "filled") in log
    assert now == pytest.approx(3 * STEP_S)


def test_a_flag_succeeds_once():
    env = simpy.Environment()
    flag = flags(env)()
    flag.succeed()
    with pytest.raises(RuntimeError, match="once"):
        flag.succeed()


def test_an_error_in_a_role_ends_the_run():
    env = simpy.Environment()

    def broken():
        yield env.timeout(1.0)
        raise ValueError("the role's own error")

    Role(env, broken())
    with pytest.raises(ValueError, match="the role's own error"):
        run(env)
    assert env.now == 1.0

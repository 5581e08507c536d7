"""Attention as programs on the simulator: the float64 reference, standard / flash1 / flash2,
and the closed-form IO formulas their counters must equal."""

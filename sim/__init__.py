"""bubblescope.sim: a SimPy discrete-event engine that replays lowered schedules."""

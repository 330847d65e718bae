"""Running steps: a claimed task's steps in order, each attempt under its time limit, compensation.

- ``runner``: a claimed task's remaining steps in one RQ job, the policies applied.
- ``attempts``: one attempt (a step, a compensation, the failure notice) run, classified and recorded.
- ``context``: ``StepContext``, what a step sees (``ctx``).
- ``classify``: transient or permanent, and the stable code.
- ``timeouts`` and ``interrupts``: a step's time limit (SIGALRM), and a cancel delivered through it.
- ``waits``: what a sleep's or a wait's attempt finds.
- ``gates``: pause, concurrency slots and rate permits, decided in PostgreSQL at a claim and a step start.
- ``compensation`` and ``compensation_plan``: undo what ran, in reverse order; what there is to undo.
- ``claim``: the claim a worker holds (a value); ``heartbeat``: the thread that keeps its leases.

Every row these change is written through the door, ``tasks.lifecycle``.
"""

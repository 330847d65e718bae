"""A password hasher for test users: PBKDF2 as in production, with few iterations.

Django's default (1,000,000 iterations) takes about half a second per
``create_user`` and per login on this machine kind: most of the setup time of
the console tests, which make five users each. The hash keeps the algorithm
name ``pbkdf2_sha256`` and states its iteration count, so processes started by
a test (gunicorn, workers), which keep the production hashers, verify it too
(and upgrade it on a first login there, as Django does).
"""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class FastPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1000

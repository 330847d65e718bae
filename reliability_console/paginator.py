"""A paginator for very large admin lists: it never counts a whole table."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.utils.functional import cached_property

# Counting stops here: the list shows "10000+" and pages past the cap are not offered.
COUNT_CAP = 10_000


class CappedCountPaginator(Paginator):
    """Counts at most ``COUNT_CAP + 1`` rows (``SELECT COUNT(*) FROM (… LIMIT n)``), cheap on any table size."""

    @cached_property
    def count(self) -> int:
        return self.object_list[: COUNT_CAP + 1].count()

    @property
    def capped(self) -> bool:
        return self.count > COUNT_CAP

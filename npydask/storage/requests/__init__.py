"""The request path of object stores: one scheduler every range GET and HEAD goes through.

See :mod:`npydask.storage.requests.scheduler` (hedging, the limit of requests
in flight) and :mod:`npydask.plan.hedging` / :mod:`npydask.plan.concurrency`
(their rules, in pure code).
"""

from __future__ import annotations

from npydask.storage.requests.scheduler import Answer, Policy, Scheduler, scheduler

__all__ = ["Answer", "Policy", "Scheduler", "scheduler"]

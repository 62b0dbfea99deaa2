"""The queue rules of reclaim: who may reclaim, from whom, and whether a reclaim keeps every queue within bounds.

KAI's proportion plugin, in integers, over every resource queues account (GPU, CPU, memory):

- **Who may reclaim** (KAI's ``CanReclaimResources``): the reclaimer's queue, with the group's minimum added, holds
  no more than its fair share of any resource.
- **From whom** (KAI's two reclaim strategies), judged where the two queues' paths meet: the reclaimer's *side* and
  the victim's side are the children of their lowest common ancestor (the roots themselves when the paths share
  none). A victim's side qualifies when, before the unit is taken, it holds more than its fair share of a resource
  the reclaimer asks for (*maintain fair share*), or when the reclaimer's side, with the minimum added, stays within
  its deserved quota of every resource and the victim's side holds more than its deserved quota of a resource the
  reclaimer asks for (*guarantee deserved quota*).
- **Within bounds** (judged on the whole scenario once the minimum is placed): on every level of the reclaimer's
  path, a queue that ends over its fair share must stay less saturated (allocated / fair share) than each sibling
  it took from, in every resource involved (KAI's ``reclaimingQueuesRemainWithinBoundaries``); and, Quotient's rule,
  no queue ends below its deserved quota in a resource with a set quota where it held at least that much before
  (deserved quota is a guarantee: KAI's documentation says so, one of KAI's tests evicts a queue below it anyway; see
  docs/actions.md). A quota of -1 ("as much as it requests") sets no such floor.

Every refusal is kept as a sentence with the numbers (``Reclaimer.refusal``) for the group's status.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence

from common.resources import Resources
from scheduler.placement import fairshare, model, plan, status, victims

KINDS = fairshare.KINDS


def _text(kind: fairshare.Kind, value: int) -> str:
    """An amount as a person reads it: ``3 GPU``, ``2 CPU``, ``9.3 GiB of memory``."""
    text = status.amount_text(kind, value)
    return f"{text} of memory" if kind is fairshare.Kind.MEMORY else text


class Reclaimer:
    """One reclaim attempt's view of the queues (lives while the attempt runs)."""

    def __init__(
        self,
        *,
        tree: fairshare.Tree,
        shares: Mapping[model.QueueName, fairshare.Share],
        usage: plan.Usage,
        group: model.Group,
        amounts: Resources,
        version: Callable[[], int] = lambda: 0,
    ) -> None:
        """``version``: changes whenever ``usage`` does (the draft's ``version``); the floor checks are kept while it
        stays (the default: ``usage`` never changes while this lives)."""
        self._tree = tree
        self._shares = shares
        self._usage = usage
        self._group = group
        self._amounts = amounts
        self._mine = tree.ancestors(group.queue)
        self._asked = tuple(kind for kind in KINDS if fairshare.amount(amounts, kind) > 0)
        self._asked_gpu = amounts.milli_gpu > 0
        self._asked_cpu = amounts.milli_cpu > 0
        self._asked_memory = amounts.memory_bytes > 0
        self._before = dict(usage.allocated)
        self._sides: dict[model.QueueName, tuple[model.QueueName, model.QueueName] | None] = {}
        self._version = version
        self._floors: dict[tuple[model.QueueName, Resources], str | None] = {}
        self._gives: dict[model.QueueName, bool] = {}
        self._checked_at = -1
        self.refusal: str | None = None
        """Why the last check refused, in numbers (None when nothing refused)."""

    # --- who may reclaim ------------------------------------------------------------------------------------------

    def may_reclaim(self) -> bool:
        """The reclaimer's queue stays within its fair share with the minimum added."""
        name = self._mine[0]
        held = self._usage.allocated[name]
        fair = self._shares[name].fair
        for kind in KINDS:
            after = fairshare.amount(held, kind) + fairshare.amount(self._amounts, kind)
            if after > fairshare.amount(fair, kind):
                self.refusal = (
                    f"queue {name} would hold {_text(kind, after)} with this group, over its fair share of "
                    f"{_text(kind, fairshare.amount(fair, kind))}: only a queue within its fair share reclaims"
                )
                return False
        return True

    # --- from whom ------------------------------------------------------------------------------------------------

    def sides(self, leaf: model.QueueName) -> tuple[model.QueueName, model.QueueName] | None:
        """The reclaimer's side and the victim's side: the children of the queues' lowest common ancestor (None when
        one queue is an ancestor of the other: a group of a parent queue, which takes no new work)."""
        if leaf in self._sides:
            return self._sides[leaf]
        found: tuple[model.QueueName, model.QueueName] | None = None
        theirs = self._tree.ancestors(leaf)
        meet = next((index for index, name in enumerate(theirs) if name in self._mine), len(theirs))
        if meet > 0 and (meet == len(theirs) or theirs[meet] != self._mine[0]):
            victim_side = theirs[meet - 1]
            mine_side = self._mine[self._mine.index(theirs[meet]) - 1] if meet < len(theirs) else self._mine[-1]
            found = (mine_side, victim_side)
        self._sides[leaf] = found
        return found

    def _over(self, name: model.QueueName, bound: Resources) -> bool:
        """Does the queue hold more than ``bound`` of a resource the reclaimer asks for?"""
        held = self._usage.allocated[name]
        return (
            (self._asked_gpu and held.milli_gpu > bound.milli_gpu)
            or (self._asked_cpu and held.milli_cpu > bound.milli_cpu)
            or (self._asked_memory and held.memory_bytes > bound.memory_bytes)
        )

    def _within_deserved(self, name: model.QueueName) -> bool:
        held = self._usage.allocated[name]
        deserved = self._shares[name].deserved
        wants = self._amounts
        return (
            held.milli_gpu + wants.milli_gpu <= deserved.milli_gpu
            and held.milli_cpu + wants.milli_cpu <= deserved.milli_cpu
            and held.memory_bytes + wants.memory_bytes <= deserved.memory_bytes
        )

    def may_give(self, leaf: model.QueueName) -> bool:
        """May a unit of ``leaf`` be taken now (one of the two strategies holds)?"""
        sides = self.sides(leaf)
        if sides is None:
            return False
        mine_side, victim_side = sides
        share = self._shares[victim_side]
        if self._over(victim_side, share.fair):
            return True
        return self._within_deserved(mine_side) and self._over(victim_side, share.deserved)

    def givers(self, leaves: Sequence[model.QueueName]) -> set[model.QueueName]:
        """The leaves that may give something now; when none, ``refusal`` says why."""
        found = {leaf for leaf in leaves if self.may_give(leaf)}
        if not found:
            asked = ", ".join(kind.value for kind in self._asked) or "anything"
            self.refusal = (
                f"no other queue holds more than its fair share of {asked} (nor, for a queue within its deserved "
                "quota, more than its deserved quota)"
            )
        return found

    def eligible(self, unit: victims.Unit) -> bool:
        """May the unit's queue give now (``may_give``, kept per queue while the draft stays as it is)?"""
        return self.gives(unit.group.queue)

    def gives(self, leaf: model.QueueName) -> bool:
        """``may_give``, kept per queue while the draft stays as it is."""
        self._forget_if_changed()
        gives = self._gives.get(leaf)
        if gives is None:
            gives = self._gives[leaf] = self.may_give(leaf)
        return gives

    def _forget_if_changed(self) -> None:
        version = self._version()
        if version != self._checked_at:
            self._floors.clear()
            self._gives.clear()
            self._checked_at = version

    def keeps_floor(self, unit: victims.Unit, evicted: Container[model.PodUid]) -> bool:
        """Would evicting ``unit`` (and not moving it) keep every queue on its side of the tree at or above its
        floor (its deserved quota, or what it held when the attempt began if that was less)?

        The queues below the two paths' meeting point gain nothing from the reclaimer's placement, so a unit that
        fails this check can only be part of a valid reclaim if it is moved: ``validate`` would refuse any plan that
        evicts it. Asking first saves every attempt built on such a victim. The answer depends on the victim's queue
        and what it would lose alone, so it is kept per both while the draft stays as it is."""
        known = self._floor(unit.group.queue, victims.live_amounts(unit, evicted))
        if known is not None:
            self.refusal = known
        return known is None

    def breaks_floor(self, leaf: model.QueueName, amounts: Resources) -> bool:
        """Would taking ``amounts`` from ``leaf`` (and not moving them) break a floor on its side? As
        ``keeps_floor`` judges it, but keeping no refusal: a question about what some unit could hold. A unit that
        holds no more of any resource breaks none if this does not (taking less leaves more)."""
        return self._floor(leaf, amounts) is not None

    def _floor(self, leaf: model.QueueName, amounts: Resources) -> str | None:
        key = (leaf, amounts)
        self._forget_if_changed()
        floors = self._floors
        if key in floors:
            return floors[key]
        found = floors[key] = self._floor_refusal(leaf, amounts)
        return found

    def _floor_refusal(self, leaf: model.QueueName, amounts: Resources) -> str | None:
        """Why taking ``amounts`` from ``leaf`` would break a floor on its side (None: it would not)."""
        theirs = self._tree.ancestors(leaf)
        allocated = self._usage.allocated
        for name in theirs:
            if name in self._mine:
                break
            queue = self._tree.queues.get(name)
            if queue is None:
                continue
            deserved = self._shares[name].deserved
            before = self._before.get(name, model.ZERO)
            for kind in KINDS:
                taken = fairshare.amount(amounts, kind)
                if taken <= 0 or fairshare.setting(queue, kind).quota == model.UNLIMITED:
                    continue
                floor = min(fairshare.amount(before, kind), fairshare.amount(deserved, kind))
                left = fairshare.amount(allocated[name], kind) - taken
                if left < floor:
                    return (
                        f"it would take queue {name} to {_text(kind, left)}, below its deserved quota of "
                        f"{_text(kind, fairshare.amount(deserved, kind))}"
                    )
        return None

    # --- within bounds --------------------------------------------------------------------------------------------

    def validate(self) -> bool:
        """Does the draft, with the minimum placed, keep every queue within bounds (see the module docstring)?"""
        allocated = self._usage.allocated
        lost: dict[model.QueueName, tuple[fairshare.Kind, ...]] = {}
        for name, before in self._before.items():
            now = allocated[name]
            if now == before:
                continue
            dropped = tuple(kind for kind in KINDS if fairshare.amount(now, kind) < fairshare.amount(before, kind))
            if not dropped:
                continue
            lost[name] = dropped
            deserved = self._shares[name].deserved
            queue = self._tree.queues[name]
            for kind in dropped:
                if fairshare.setting(queue, kind).quota == model.UNLIMITED:
                    continue  # "as much as it requests" guarantees nothing against reclaim (nor does KAI's -1)
                floor = min(fairshare.amount(before, kind), fairshare.amount(deserved, kind))
                if fairshare.amount(now, kind) < floor:
                    self.refusal = (
                        f"it would take queue {name} to {_text(kind, fairshare.amount(now, kind))}, below its "
                        f"deserved quota of {_text(kind, fairshare.amount(deserved, kind))}"
                    )
                    return False
        parent_of = self._tree.parent_of
        for level in self._mine:
            parent = parent_of.get(level)
            siblings = self._tree.children.get(parent, ()) if parent is not None else self._tree.roots
            for sibling in siblings:
                if sibling == level or sibling not in lost:
                    continue
                for kind in dict.fromkeys((*self._asked, *lost[sibling])):
                    if not self._less_saturated(level, sibling, kind):
                        return False
        return True

    def _less_saturated(self, mine: model.QueueName, theirs: model.QueueName, kind: fairshare.Kind) -> bool:
        """KAI's saturation rule: ``mine`` over its fair share must stay strictly less saturated than ``theirs``."""
        allocated = self._usage.allocated
        used = fairshare.amount(allocated[mine], kind)
        fair = fairshare.amount(self._shares[mine].fair, kind)
        their_used = fairshare.amount(allocated[theirs], kind)
        their_fair = fairshare.amount(self._shares[theirs].fair, kind)
        if used <= fair or their_fair <= 0:
            return True
        # used / fair < their_used / their_fair, with fair == 0 meaning infinitely saturated
        if fair > 0 and used * their_fair < their_used * fair:
            return True
        self.refusal = (
            f"queue {mine} would hold {_text(kind, used)} against a fair share of {_text(kind, fair)}, no less "
            f"saturated than queue {theirs} ({_text(kind, their_used)} against {_text(kind, their_fair)})"
        )
        return False

"""Fair share: KAI's rule with siblings never summing to more than their parent, exact in integers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from common.resources import Resources
from scheduler.placement import fairshare, model

GPU = fairshare.Kind.GPU


def _queue(name: str, parent: str | None = None, **gpu: int) -> model.Queue:
    return model.Queue(
        name=model.QueueName(name),
        parent=model.QueueName(parent) if parent else None,
        gpu=model.QueueResource(
            quota=gpu.get("quota", -1), limit=gpu.get("limit", -1), over_quota_weight=gpu.get("weight", 1)
        ),
        priority=gpu.get("priority", 100),
        created_ns=gpu.get("created", 0),
    )


def _divide(queues: list[model.Queue], requested: dict[str, int], gpus: int) -> dict[str, fairshare.Share]:
    tree = fairshare.tree({queue.name: queue for queue in queues})
    shares = fairshare.divide(
        queue_tree=tree,
        requested={model.QueueName(name): Resources(milli_gpu=value) for name, value in requested.items()},
        capacity=Resources(milli_gpu=gpus),
    )
    return {str(name): share for name, share in shares.items()}


def test_quota_is_deserved_first_and_the_spare_goes_by_weight() -> None:
    shares = _divide(
        [_queue("org"), _queue("a", "org", quota=2000, weight=1), _queue("b", "org", quota=2000, weight=3)],
        {"a": 16000, "b": 16000},
        16000,
    )
    assert shares["a"].deserved.milli_gpu == 2000
    assert shares["a"].fair.milli_gpu == 5000
    assert shares["b"].fair.milli_gpu == 11000


def test_unlimited_quota_siblings_never_sum_to_more_than_the_parent() -> None:
    shares = _divide([_queue("root"), _queue("x", "root"), _queue("y", "root")], {"x": 8000, "y": 8000}, 10000)
    assert shares["x"].deserved.milli_gpu + shares["y"].deserved.milli_gpu == 10000
    assert shares["x"].fair.milli_gpu + shares["y"].fair.milli_gpu == 10000


def test_a_set_quota_is_deserved_before_any_sibling_whose_quota_is_unlimited() -> None:
    # KAI's unschedulable scale test: a queue of quota "all GPUs but 79" keeps them whatever an unlimited sibling
    # created before it asks; the sibling deserves the 79 left, not its 80.
    shares = _divide(
        [
            _queue("root"),
            _queue("asks", "root", quota=-1, weight=1, created=1),
            _queue("keeps", "root", quota=81_000, weight=0, created=2),
        ],
        {"asks": 80_000, "keeps": 160_000},
        160_000,
    )
    assert shares["keeps"].deserved.milli_gpu == 81_000
    assert shares["asks"].deserved.milli_gpu == 79_000
    assert shares["asks"].fair.milli_gpu == 79_000


def test_deserved_goes_by_priority_then_age_then_name() -> None:
    shares = _divide(
        [
            _queue("root"),
            _queue("old", "root", quota=-1, weight=0, created=1),
            _queue("young", "root", quota=-1, weight=0, created=2),
            _queue("vip", "root", quota=-1, weight=0, created=3, priority=200),
        ],
        {"old": 5000, "young": 5000, "vip": 5000},
        8000,
    )
    assert shares["vip"].fair.milli_gpu == 5000
    assert shares["old"].fair.milli_gpu == 3000
    assert shares["young"].fair.milli_gpu == 0


def test_higher_priority_takes_the_spare_before_lower_priority() -> None:
    shares = _divide(
        [
            _queue("root"),
            _queue("high", "root", quota=0, weight=1, priority=200),
            _queue("low", "root", quota=0, weight=9, priority=50),
        ],
        {"high": 6000, "low": 6000},
        8000,
    )
    assert shares["high"].fair.milli_gpu == 6000
    assert shares["low"].fair.milli_gpu == 2000


def test_weight_zero_takes_no_spare_and_limit_caps_the_share() -> None:
    shares = _divide(
        [_queue("root"), _queue("frozen", "root", quota=1000, weight=0), _queue("capped", "root", quota=0, limit=3000)],
        {"frozen": 8000, "capped": 8000},
        8000,
    )
    assert shares["frozen"].fair.milli_gpu == 1000
    assert shares["capped"].fair.milli_gpu == 3000


def test_a_limit_of_zero_gives_nothing() -> None:
    shares = _divide([_queue("root"), _queue("none", "root", quota=-1, limit=0)], {"none": 1000}, 8000)
    assert shares["none"].fair.milli_gpu == 0


def test_an_orphan_queue_is_a_root_and_a_cycle_is_cut() -> None:
    tree = fairshare.tree(
        {
            model.QueueName("orphan"): _queue("orphan", "missing"),
            model.QueueName("a"): _queue("a", "b"),
            model.QueueName("b"): _queue("b", "a"),
        }
    )
    assert "orphan" in tree.roots
    assert len(tree.depth_first()) == 3


@st.composite
def _trees(draw: st.DrawFn) -> tuple[list[model.Queue], dict[str, int], int]:
    count = draw(st.integers(1, 9))
    queues: list[model.Queue] = []
    for index in range(count):
        parent = draw(st.one_of(st.none(), st.integers(0, index - 1))) if index else None
        queues.append(
            _queue(
                f"q{index}",
                f"q{parent}" if parent is not None else None,
                quota=draw(st.sampled_from([-1, 0, 500, 1000, 3000, 7777])),
                limit=draw(st.sampled_from([-1, -1, 0, 1000, 4000, 9999])),
                weight=draw(st.integers(0, 4)),
                priority=draw(st.sampled_from([50, 100, 100, 200])),
                created=draw(st.integers(0, 3)),
            )
        )
    requested = {str(queue.name): draw(st.integers(0, 12000)) for queue in queues}
    return queues, requested, draw(st.integers(0, 20000))


@settings(max_examples=300, deadline=None)
@given(_trees())
def test_siblings_share_exactly_what_the_parent_has_up_to_their_capped_demand(
    case: tuple[list[model.Queue], dict[str, int], int],
) -> None:
    queues, requested, gpus = case
    by_name = {queue.name: queue for queue in queues}
    tree = fairshare.tree(by_name)
    shares = _divide(queues, requested, gpus)
    totals = fairshare.subtree_requests(
        tree, {model.QueueName(name): Resources(milli_gpu=value) for name, value in requested.items()}
    )

    def check(siblings: tuple[model.QueueName, ...], available: int) -> None:
        given = [shares[name].fair.milli_gpu for name in siblings]
        demand = [fairshare.capped_demand(by_name[name].gpu, totals[name].milli_gpu) for name in siblings]
        assert sum(given) == min(available, sum(demand))
        for name, share, cap in zip(siblings, given, demand, strict=True):
            assert 0 <= shares[name].deserved.milli_gpu <= share <= cap
            if by_name[name].gpu.limit != model.UNLIMITED:
                assert share <= by_name[name].gpu.limit
            check(tree.children.get(name, ()), share)

    check(tree.roots, gpus)

"""The sequence gate follows each publisher's stream of a node: no message can make another publisher's later ones
look old, and two live publishers are named as rivals."""

from __future__ import annotations

from common import sequencing

S = 1_000_000_000
LIVE = 3 * S


def test_messages_in_order_are_accepted() -> None:
    gate = sequencing.SequenceGate()
    verdicts = [gate.admit("n", boot="a", seq=seq, ts_ns=100 + seq) for seq in (0, 1, 2, 7)]
    assert verdicts == [sequencing.Admission.ACCEPTED] * 4


def test_only_the_very_message_a_stream_ends_with_is_refused_as_a_duplicate() -> None:
    gate = sequencing.SequenceGate()
    gate.admit("n", boot="a", seq=5, ts_ns=100)
    assert gate.admit("n", boot="a", seq=5, ts_ns=100) is sequencing.Admission.REPEATED_SEQ
    assert gate.admit("n", boot="a", seq=6, ts_ns=101) is sequencing.Admission.ACCEPTED
    assert gate.admit("n", boot="a", seq=6, ts_ns=101) is sequencing.Admission.REPEATED_SEQ


def test_a_restarted_agent_is_accepted_although_its_sequence_starts_lower() -> None:
    gate = sequencing.SequenceGate()
    gate.admit("n", boot="a", seq=9000, ts_ns=100)
    assert gate.admit("n", boot="b", seq=0, ts_ns=101) is sequencing.Admission.RESTARTED
    assert gate.admit("n", boot="b", seq=1, ts_ns=102) is sequencing.Admission.ACCEPTED


def test_a_huge_forged_sequence_number_does_not_mute_the_real_agent() -> None:
    gate = sequencing.SequenceGate()
    for seq in range(1, 4):
        gate.admit("n", boot="a", seq=seq, ts_ns=seq * S)
    assert gate.admit("n", boot="a", seq=10**15, ts_ns=4 * S).accepted  # the forgery
    # The real agent's next message is behind the forged one: a fork, accepted; its stream goes on from there.
    assert gate.admit("n", boot="a", seq=4, ts_ns=5 * S) is sequencing.Admission.FORKED
    assert gate.admit("n", boot="a", seq=5, ts_ns=6 * S) is sequencing.Admission.ACCEPTED
    assert gate.admit("n", boot="a", seq=6, ts_ns=7 * S) is sequencing.Admission.ACCEPTED


def test_a_forged_new_boot_stamped_later_does_not_retire_the_real_one() -> None:
    gate = sequencing.SequenceGate()
    gate.admit("n", boot="real", seq=10, ts_ns=100 * S)
    assert gate.admit("n", boot="forged", seq=0, ts_ns=129 * S) is sequencing.Admission.RESTARTED
    assert gate.admit("n", boot="real", seq=11, ts_ns=101 * S) is sequencing.Admission.ACCEPTED
    assert gate.admit("n", boot="forged", seq=1, ts_ns=130 * S) is sequencing.Admission.ACCEPTED


def test_a_message_extends_the_stream_closest_below_it_and_of_two_equal_the_most_recently_heard() -> None:
    gate = sequencing.SequenceGate()
    gate.admit("n", boot="a", seq=10, ts_ns=1, received_ns=1)
    gate.admit("n", boot="a", seq=5, ts_ns=2, received_ns=2)  # a fork at 5
    assert gate.admit("n", boot="a", seq=7, ts_ns=3, received_ns=3) is sequencing.Admission.ACCEPTED  # after 5
    assert gate.admit("n", boot="a", seq=10, ts_ns=4, received_ns=4) is sequencing.Admission.ACCEPTED  # after 7
    # Both streams end at 10 now; the next goes after the one heard last (not a third stream).
    assert gate.admit("n", boot="a", seq=11, ts_ns=5, received_ns=5) is sequencing.Admission.ACCEPTED
    assert gate.admit("n", boot="a", seq=10, ts_ns=1, received_ns=6) is sequencing.Admission.REPEATED_SEQ


def test_during_a_replay_a_message_behind_its_stream_is_superseded_not_a_fork() -> None:
    gate = sequencing.SequenceGate()
    gate.admit("n", boot="a", seq=10, ts_ns=10)
    assert gate.admit("n", boot="a", seq=9, ts_ns=9, replay=True) is sequencing.Admission.SUPERSEDED
    assert gate.admit("n", boot="a", seq=11, ts_ns=11, replay=True) is sequencing.Admission.ACCEPTED
    # A boot the gate does not follow is new, replay or not.
    assert gate.admit("n", boot="b", seq=1, ts_ns=12, replay=True) is sequencing.Admission.RESTARTED


def test_a_node_holds_a_bounded_number_of_streams_and_still_accepts_its_real_agent() -> None:
    gate = sequencing.SequenceGate()
    gate.admit("n", boot="real", seq=1, ts_ns=1, received_ns=1)
    for i in range(50):  # a flood of forged boots, each opening a stream
        assert gate.admit("n", boot=f"forged-{i}", seq=0, ts_ns=2, received_ns=2 + i).accepted
    assert gate.admit("n", boot="real", seq=2, ts_ns=3, received_ns=100).accepted
    assert len(gate.rivals("n", now_ns=100)) <= sequencing.MAX_STREAMS_PER_NODE


def test_an_agent_restart_makes_no_rivals() -> None:
    gate = sequencing.SequenceGate()
    for i in range(3):
        gate.admit("n", boot="old", seq=100 + i, ts_ns=i * S, received_ns=i * S, live_for_ns=LIVE)
    for i in range(3, 6):
        gate.admit("n", boot="new", seq=i, ts_ns=i * S, received_ns=i * S, live_for_ns=LIVE)
    assert gate.crowded() == ["n"]
    assert gate.rivals("n", now_ns=4 * S) == ()  # both live, but the old one ended before the new one began


def test_two_interleaved_boots_are_rivals_while_both_are_live() -> None:
    gate = sequencing.SequenceGate()
    gate.admit("n", boot="real", seq=1, ts_ns=0, received_ns=0, live_for_ns=LIVE)
    gate.admit("n", boot="forged", seq=1, ts_ns=1 * S, received_ns=1 * S, live_for_ns=LIVE)
    assert gate.rivals("n", now_ns=1 * S) == ()  # not yet interleaved: it could be a restart
    gate.admit("n", boot="real", seq=2, ts_ns=2 * S, received_ns=2 * S, live_for_ns=LIVE)
    rivals = gate.rivals("n", now_ns=2 * S)
    assert [(stream.boot, stream.seq) for stream in rivals] == [("forged", 1), ("real", 2)]
    assert gate.rivals("n", now_ns=4 * S + 1) == ()  # the forged stream is no longer live


def test_a_forked_boot_is_rivals_with_itself_while_both_streams_are_live() -> None:
    gate = sequencing.SequenceGate()
    gate.admit("n", boot="a", seq=1, ts_ns=0, received_ns=0, live_for_ns=LIVE)
    gate.admit("n", boot="a", seq=10**15, ts_ns=1 * S, received_ns=1 * S, live_for_ns=LIVE)
    gate.admit("n", boot="a", seq=2, ts_ns=2 * S, received_ns=2 * S, live_for_ns=LIVE)
    rivals = gate.rivals("n", now_ns=2 * S)
    assert [(stream.seq, stream.forked) for stream in rivals] == [(10**15, False), (2, True)]
    assert gate.rivals("n", now_ns=4 * S + 1) == ()


def test_pruning_drops_long_dead_streams_but_keeps_the_newest() -> None:
    gate = sequencing.SequenceGate()
    gate.admit("n", boot="old", seq=1, ts_ns=0, received_ns=0, live_for_ns=LIVE)
    gate.admit("n", boot="new", seq=1, ts_ns=10 * S, received_ns=10 * S, live_for_ns=LIVE)
    gate.prune("n", dead_before_ns=5 * S)
    assert gate.crowded() == []
    # The pruned boot's last message is no longer known: it opens a stream again.
    assert gate.admit("n", boot="old", seq=1, ts_ns=0, received_ns=20 * S) is sequencing.Admission.RESTARTED


def test_nodes_are_gated_independently_and_can_be_forgotten() -> None:
    gate = sequencing.SequenceGate()
    gate.admit("n1", boot="a", seq=5, ts_ns=100)
    assert gate.admit("n2", boot="a", seq=1, ts_ns=50) is sequencing.Admission.ACCEPTED
    assert len(gate) == 2
    gate.forget("n1")
    gate.forget("never-seen")
    assert len(gate) == 1
    assert gate.admit("n1", boot="a", seq=1, ts_ns=50) is sequencing.Admission.ACCEPTED

from __future__ import annotations

from common import sequencing


def test_messages_in_order_are_accepted() -> None:
    gate = sequencing.SequenceGate()
    verdicts = [gate.admit("n", boot="a", seq=seq, ts_ns=100 + seq) for seq in (0, 1, 2, 7)]
    assert verdicts == [sequencing.Admission.ACCEPTED] * 4


def test_a_repeated_or_older_sequence_number_is_rejected() -> None:
    gate = sequencing.SequenceGate()
    gate.admit("n", boot="a", seq=5, ts_ns=100)
    assert gate.admit("n", boot="a", seq=5, ts_ns=100) is sequencing.Admission.REPEATED_SEQ
    assert gate.admit("n", boot="a", seq=4, ts_ns=200) is sequencing.Admission.REPEATED_SEQ
    assert gate.admit("n", boot="a", seq=6, ts_ns=101).accepted


def test_a_restarted_agent_is_accepted_although_its_sequence_starts_lower() -> None:
    gate = sequencing.SequenceGate()
    gate.admit("n", boot="a", seq=9000, ts_ns=100)
    assert gate.admit("n", boot="b", seq=0, ts_ns=101) is sequencing.Admission.RESTARTED
    assert gate.admit("n", boot="b", seq=1, ts_ns=102) is sequencing.Admission.ACCEPTED


def test_a_late_message_of_the_old_boot_cannot_flip_back() -> None:
    gate = sequencing.SequenceGate()
    gate.admit("n", boot="a", seq=10, ts_ns=100)
    gate.admit("n", boot="b", seq=0, ts_ns=200)
    assert gate.admit("n", boot="a", seq=11, ts_ns=150) is sequencing.Admission.RETIRED_BOOT
    # Even an old agent still running during a rolling update, with a later clock, stays retired.
    assert gate.admit("n", boot="a", seq=12, ts_ns=300) is sequencing.Admission.RETIRED_BOOT
    assert gate.admit("n", boot="b", seq=1, ts_ns=201) is sequencing.Admission.ACCEPTED


def test_an_unknown_boot_stamped_before_the_last_accepted_message_is_rejected() -> None:
    gate = sequencing.SequenceGate()
    gate.admit("n", boot="b", seq=0, ts_ns=200)
    assert gate.admit("n", boot="a", seq=50, ts_ns=150) is sequencing.Admission.OLDER_BOOT
    assert gate.admit("n", boot="a", seq=50, ts_ns=200) is sequencing.Admission.OLDER_BOOT


def test_nodes_are_gated_independently_and_can_be_forgotten() -> None:
    gate = sequencing.SequenceGate()
    gate.admit("n1", boot="a", seq=5, ts_ns=100)
    assert gate.admit("n2", boot="a", seq=1, ts_ns=50) is sequencing.Admission.ACCEPTED
    assert len(gate) == 2
    gate.forget("n1")
    gate.forget("never-seen")
    assert len(gate) == 1
    assert gate.admit("n1", boot="a", seq=1, ts_ns=50) is sequencing.Admission.ACCEPTED

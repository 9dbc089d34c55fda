"""The one worst-exit rule (docs/commands.md, "The exit code"): what a script sees when several targets
end differently, and status' own contract rule beside it (3 if any target could not be reached)."""

from __future__ import annotations

import itertools

from gpuops.errors import ExitCode, status_exit, worst_exit

#: The documented order, worst first; 0 only when every target succeeded.
DOCUMENTED = (143, 130, 141, 1, 7, 8, 6, 5, 4, 3, 2, 124)


def test_every_pair_of_codes_ends_with_the_one_the_docs_rank_worse() -> None:
    for a, b in itertools.combinations(DOCUMENTED, 2):
        assert worst_exit([b, a]) == a and worst_exit([a, b]) == a, (a, b)
        assert worst_exit([ExitCode.OK, b, ExitCode.OK]) == b


def test_zero_only_when_every_target_succeeded() -> None:
    assert worst_exit([0, 0, 0]) == 0
    assert worst_exit([]) == 0
    assert worst_exit([0, 124]) == 124  # a budget that ran out is not a success


def test_an_unknown_code_ranks_just_below_a_bug() -> None:
    assert worst_exit([8, 99]) == 99 and worst_exit([3, 99]) == 99
    assert worst_exit([1, 99]) == 1


def test_status_exits_3_when_any_target_could_not_be_reached() -> None:
    assert status_exit([]) == 0
    assert status_exit([3]) == 3
    assert status_exit([2, 3]) == 3
    assert status_exit([1, 3]) == 3  # worst_exit would say 1: status' contract says 3
    assert status_exit([2, 2]) == 2  # the same local SSH file problem everywhere: a configuration error

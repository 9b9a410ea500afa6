"""StopBoard: stop requests keyed by chunk id, in whatever order Ray delivers them."""

from __future__ import annotations

import threading

import pytest

from workers.host.stops import StopBoard


def test_request_before_its_chunk_starts_is_kept_for_it():
    """Ray may run request_stop before run_steps of the same chunk: the request waits for it."""
    board = StopBoard()
    assert board.request(1, 7)
    board.begin(1)
    assert board.stop_at(1) == 7


def test_request_for_an_ended_chunk_does_not_leak_into_the_next():
    """A late stop for chunk 1 (arriving after it ended) never stops chunk 2."""
    board = StopBoard()
    board.begin(1)
    board.end(1)
    assert not board.request(1, 0)
    board.begin(2)
    assert board.stop_at(2) is None


def test_request_for_an_older_chunk_while_a_newer_runs_is_ignored():
    board = StopBoard()
    board.begin(1)
    board.end(1)
    board.begin(2)
    assert not board.request(1, 3)
    assert board.stop_at(2) is None
    assert board.stop_at(1) is None


def test_stale_request_stored_before_a_newer_chunk_is_dropped_when_it_begins():
    """Requests for chunk 3 stored early, then chunk 4 begins without 3 ever running: dropped."""
    board = StopBoard()
    assert board.request(3, 10)
    board.begin(4)
    assert board.stop_at(3) is None and board.stop_at(4) is None


def test_two_requests_keep_the_earlier_step():
    board = StopBoard()
    board.begin(5)
    board.request(5, 12)
    board.request(5, 9)
    board.request(5, 11)
    assert board.stop_at(5) == 9


def test_a_chunk_id_cannot_be_reused():
    """Chunk ids must grow; reusing one would revive its spent requests."""
    board = StopBoard()
    board.begin(2)
    board.end(2)
    with pytest.raises(ValueError, match="chunk ids must increase"):
        board.begin(2)


def test_concurrent_requests_from_many_threads():
    """Requests from many threads land (thread-safe): the minimum step wins."""
    board = StopBoard()
    board.begin(1)
    threads = [threading.Thread(target=board.request, args=(1, 100 - i)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert board.stop_at(1) == 51

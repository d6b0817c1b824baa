"""Positions in a padded batch: position ids, first and last real tokens, padding."""

from __future__ import annotations

import pytest
import torch

from captum_ffb.engine.positions import pad_sequences, position_ids, real_positions


def test_pad_sequences_on_either_side():
    ids, mask = pad_sequences([[5, 6, 7], [8]], pad_id=0, side="left")
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    ids, mask = pad_sequences([(5, 6, 7), (8,)], pad_id=9, side="right")
    assert ids.tolist() == [[5, 6, 7], [8, 9, 9]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert ids.dtype == mask.dtype == torch.long


def test_pad_sequences_rejects_an_unknown_side_and_no_rows():
    with pytest.raises(ValueError, match="side"):
        pad_sequences([[1]], 0, "middle")
    with pytest.raises(ValueError, match="no sequences"):
        pad_sequences([], 0)


def test_position_ids_start_at_each_rows_first_real_token():
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]])
    assert position_ids(mask).tolist() == [[0, 0, 0, 1], [0, 1, 2, 3], [0, 1, 1, 1]]


def test_real_positions_for_left_and_right_padding():
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]])
    assert real_positions(mask, "first").tolist() == [2, 0, 0]
    assert real_positions(mask, "last").tolist() == [3, 3, 1]
    assert real_positions(mask.bool(), "last").tolist() == [3, 3, 1]


def test_real_positions_needs_a_real_token_per_row_and_a_known_end():
    with pytest.raises(ValueError, match="no real token"):
        real_positions(torch.tensor([[1, 1], [0, 0]]), "last")
    with pytest.raises(ValueError, match="first"):
        real_positions(torch.ones(1, 2), "middle")

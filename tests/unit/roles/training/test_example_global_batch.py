"""train_tiny.py keeps its global batch when the job shrinks or grows (--global-batch): the split into
micro batches and gradient accumulation, read from the example itself (it needs torch to import)."""

import ast
import os

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'roles', 'training', 'files', 'train_tiny.py')


def _batch_split():
    with open(EXAMPLE) as handle:
        tree = ast.parse(handle.read())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == 'batch_split')
    space = {}
    exec(compile(ast.Module(body=[node], type_ignores=[]), EXAMPLE, 'exec'), space)  # pylint: disable=exec-used
    return space['batch_split']


@pytest.mark.parametrize('world', [5, 4, 3, 2, 1])
def test_the_global_batch_is_the_same_on_every_world_size_the_job_may_shrink_to(world):
    split = _batch_split()
    micro, accumulation = split(120, world, 16)
    assert micro * accumulation * world == 120 and 0 < micro <= 16


def test_without_a_global_batch_each_rank_takes_its_micro_batch_once():
    assert _batch_split()(0, 4, 16) == (16, 1)


def test_a_global_batch_no_split_reaches_is_refused_naming_the_sizes():
    with pytest.raises(SystemExit, match='--global-batch 7 cannot be split over 3 ranks'):
        _batch_split()(7, 3, 16)


def test_the_loop_accumulates_over_the_micro_batches_of_one_step_and_says_the_split():
    with open(EXAMPLE) as handle:
        text = handle.read()
    assert 'for _ in range(args.accumulation):' in text
    assert "'gradient_accumulation_steps': args.accumulation" in text
    assert 'global batch %d = micro batch %d x accumulation %d x world %d' in text

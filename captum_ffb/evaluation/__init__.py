"""Evaluation of attributions: the tasks, their data, and faithfulness measures."""

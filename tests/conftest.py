"""Shared fixtures: config files in a temporary folder."""

import textwrap

import pytest


@pytest.fixture
def write_config(tmp_path):
    """write_config(text, name="job.yaml") -> path of a dedented YAML file."""

    def write(text, name="job.yaml"):
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        return str(path)

    return write

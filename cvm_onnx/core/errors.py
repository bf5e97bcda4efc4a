"""The project's errors: one family per pipeline stage, each carrying every problem found.

A ``Problem`` names where (a node, a file offset, a key) and which rule was broken. An error holds a list of
problems so a whole model can be reported at once; the CLI prints one line per problem and exits with the
family's code (see docs/cli.md).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One broken rule at one place: ``where`` is a node name (or file location), ``rule`` says what is wrong.
    Printed as one line: a line break or other unprintable character (a file's own name may hold any) escaped."""

    where: str
    rule: str

    def __str__(self) -> str:
        return one_line(f"{self.where}: {self.rule}" if self.where else self.rule)


def one_line(text: object) -> str:
    """``text`` on one line: control characters (newlines, terminal escapes in hostile names) shown escaped."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))


class CVMError(Exception):
    """Base of every error the project raises on purpose. ``exit_code`` is the CLI's exit status."""

    exit_code = 1
    kind = "error"

    def __init__(self, problems: list[Problem] | Problem | str, where: str = ""):
        if isinstance(problems, str):
            problems = [Problem(where, problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    def __reduce__(self):  # pickled with its problems (errors raised in Ray workers)
        return type(self), (self.problems,)


class FormatError(CVMError):
    """A file (symbol JSON, params binary, ONNX model, .npy input) cannot be read as what it claims to be."""

    exit_code = 2
    kind = "format error"


class ValidationError(CVMError):
    """A model breaks a load-time rule of the CVM runtime (attribute, shape, precision, graph structure)."""

    exit_code = 3
    kind = "invalid model"


class UnsupportedError(CVMError):
    """A model is valid but has no exact form on the other side (an ONNX op with no CVM equivalent, ...)."""

    exit_code = 4
    kind = "unsupported"


class RuntimeFailure(CVMError):
    """Running a model failed (onnxruntime refused it, an input does not fit, results differ)."""

    exit_code = 5
    kind = "runtime error"

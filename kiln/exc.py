"""kiln's exceptions: every error a user can see from kiln is one of these.

They are RuntimeErrors, as torch.compile's are (its graph-break, backend and argument errors all
subclass RuntimeError), so code written against torch.compile (`except RuntimeError`) works unchanged.
"""
from kiln.debug import break_kinds


class KilnError(RuntimeError):
    """Base class of kiln's own errors."""


class InvalidArgument(KilnError, ValueError, TypeError):
    """Bad input to a public function: an unknown backend, mode or option, a wrong type.

    It is a RuntimeError (what torch.compile raises for an unknown mode or option) and also a
    ValueError and a TypeError, so callers catching any of them see it.
    """


class InvalidBackend(InvalidArgument):
    """A backend name that is not registered."""


class Unsupported(KilnError):
    """A construct capture cannot put into a graph.

    Under fullgraph=False it becomes a graph break; under fullgraph=True it is raised to the
    user, naming the construct and the file:line of the user's code. `kind` names its entry in
    kiln.debug.break_kinds (explanation, hint); an untagged raise site is classified by its message.
    """

    reraised_in = None  # the capture frame whose bare raise / RERAISE raised python_exception again

    def __init__(self, msg, *, where=None, python_exception=None, kind=None):
        self.msg = msg
        self.where = where  # "file:line" in user code, when known
        self.python_exception = python_exception  # a real exception the captured code raised, if any
        if kind is not None and kind not in break_kinds.KINDS:
            raise ValueError(f"unknown graph-break kind {kind!r}; known: {sorted(break_kinds.KINDS)}")
        self._kind = kind
        super().__init__(f"{msg} (at {where})" if where else msg)

    @property
    def kind(self):
        """Its kind's name; an untagged one is classified when first asked (capture raises and catches
        many Unsupported internally, most never reported)."""
        if self._kind is None:
            self._kind = break_kinds.classify(self.msg, self.python_exception)
        return self._kind


class InternalError(KilnError):
    """kiln failed on a program it should handle (a bug in kiln; the cause is chained). Without
    fullgraph the frame runs eagerly instead (logged under KILN_LOGS=graph_breaks); under
    fullgraph=True, which promises one graph or an error, it is raised."""


class BackendCompilerFailed(KilnError):
    """A backend raised while compiling a graph; the cause is chained."""

    def __init__(self, backend_name, cause):
        self.backend_name = backend_name
        self.cause = cause
        super().__init__(f"backend {backend_name!r} raised {type(cause).__name__}: {cause}")


class FailOnRecompileLimitHit(Exception):
    """Under fullgraph=True a frame that reaches kiln.config.cache_size_limit raises this instead of
    running eagerly. Like torch.compile's error of the same name it is not a RuntimeError (nor a
    KilnError): an `except RuntimeError` meant for graph breaks does not swallow it."""


class ConstraintViolation(KilnError):
    """A dim marked with kiln.mark_dynamic that the program forces static (or outside its bounds).

    Names the input dim and, when known, the user's line that specialized it.
    """

    def __init__(self, msg, *, source=None, dim=None, where=None):
        self.source, self.dim, self.where = source, dim, where
        super().__init__(msg)

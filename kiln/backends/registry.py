"""The named-backend registry behind `kiln.register_backend` and `kiln.list_backends`."""
from kiln.exc import InvalidArgument, InvalidBackend

_BACKENDS = {}  # name -> (compiler_fn, tags)


def register_backend(compiler_fn=None, name=None, tags=()):
    """Register `compiler_fn` under `name` (default: its __name__).

    Works as `register_backend(fn)`, `register_backend(fn, name="x")` and as a decorator
    `@register_backend` / `@register_backend(name="x", tags=("debug",))`.
    A name already taken is an error.
    """
    if compiler_fn is None:
        return lambda fn: register_backend(fn, name=name, tags=tags)
    if not callable(compiler_fn):
        raise InvalidArgument(f"register_backend expects a callable backend, got {type(compiler_fn).__name__}")
    name = name or compiler_fn.__name__
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"backend name must be a non-empty string, got {name!r}")
    if name in _BACKENDS:
        raise InvalidArgument(f"a backend named {name!r} is already registered")
    _BACKENDS[name] = (compiler_fn, tuple(tags))
    return compiler_fn


def list_backends(exclude_tags=("debug", "experimental")):
    """Sorted names of the registered backends; `list_backends(None)` includes debug/experimental ones."""
    exclude = set(exclude_tags or ())
    return sorted(name for name, (_, tags) in _BACKENDS.items() if not exclude.intersection(tags))


def lookup_backend(backend):
    """A backend name or callable -> the compiler callable."""
    if isinstance(backend, str):
        if backend not in _BACKENDS:
            raise InvalidBackend(f"invalid backend {backend!r}; registered backends: "
                                 f"{', '.join(list_backends(None))} (see kiln.list_backends())")
        return _BACKENDS[backend][0]
    if callable(backend):
        return backend
    raise InvalidArgument(f"backend must be a name or a callable (gm, example_inputs) -> callable, "
                          f"got {type(backend).__name__}")


class BoundBackend:
    """A backend with its name and the compiler options of one `kiln.compile` call.

    Calling it is the backend contract: (gm, example_inputs) -> compiled callable. The name is
    what errors and logs show ("backend 'inductor' raised ...").
    """

    def __init__(self, name, fn, options=None):
        self.name, self.fn, self.options = name, fn, options

    def __call__(self, gm, example_inputs):
        if self.options is not None:
            return self.fn(gm, example_inputs, options=self.options)
        return self.fn(gm, example_inputs)

    def __repr__(self):
        return f"BoundBackend({self.name!r})"


def bind_backend(backend, options=None):
    """A name or callable -> BoundBackend.

    Compiler options go only to backends that declare `kiln_takes_options` (kiln's own).
    """
    fn = lookup_backend(backend)
    name = backend if isinstance(backend, str) else getattr(backend, "__name__", type(backend).__name__)
    return BoundBackend(name, fn, options if getattr(fn, "kiln_takes_options", False) else None)

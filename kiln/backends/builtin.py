"""The backends kiln ships: eager (debug), inductor (kiln's compiler), aot_eager (debug)."""
from kiln.backends.registry import register_backend


@register_backend(name="eager", tags=("debug",))
def eager(gm, example_inputs, **kwargs):
    """Run the captured graph as it is: isolates capture from the compiler."""
    return gm.forward


@register_backend(name="inductor")
def inductor(gm, example_inputs, options=None):
    """kiln's optimizing compiler: aten lowering, fused loops, C++/OpenMP code."""
    from kiln.compiler import compile_fx
    return compile_fx(gm, example_inputs, options=options)


@register_backend(name="aot_eager", tags=("debug",))
def aot_eager(gm, example_inputs, **kwargs):
    """The compiler's aot step (aten trace, functionalize, joint fw/bw partition), graphs run eagerly."""
    from kiln.compiler import compile_fx
    return compile_fx(gm, example_inputs, options=kwargs.get("options"), inner="eager")


inductor.kiln_takes_options = aot_eager.kiln_takes_options = True
# called without a TracingContext and with plain numbers (capture/user_backends.py says why)
eager.kiln_own = inductor.kiln_own = aot_eager.kiln_own = True

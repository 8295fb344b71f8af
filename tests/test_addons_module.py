"""addons.Module, variable factories, binding, graph caching and custom gradients."""

import re
from functools import partial

import numpy as np
import pytest

import addons
import popxl_core as popxl
from popxl_core import ops

from .test_addons_models import Linear, Net, NetOutlined

SPEC = popxl.TensorSpec((2, 4), popxl.float32)


def _linear(ir, out=32):
    with ir.main_graph:
        return Linear(out).create_graph(SPEC)


# create_graph -----------------------------------------------------------------------
def test_create_graph_names_graph_inputs_and_leaves_no_state():
    ir = popxl.Ir()
    module = Linear(32)
    with ir.main_graph:
        facts, graph = module.create_graph(SPEC)
    assert graph.graph.name == "Linear_subgraph(0)"
    assert [t.name for t in graph.graph.inputs] == ["x", "weight", "bias"]
    assert graph.args.to_dict() == {"weight": graph.graph.inputs[1], "bias": graph.graph.inputs[2]}
    assert facts.keys_flat() == ["weight", "bias"]
    assert facts.weight.shape == (4, 32) and facts.bias.dtype is popxl.float32
    assert module._variable_factories.len_flat() == 0 and module._named_inputs.len_flat() == 0
    with ir.main_graph:
        facts2, graph2 = module.create_graph(SPEC)
    assert graph2.graph.name == "Linear_subgraph(1)" and facts2.keys_flat() == facts.keys_flat()


def test_create_graph_needs_a_graph_context():
    with pytest.raises(RuntimeError, match="with ir.main_graph"):
        Linear(3).create_graph(SPEC)


def test_factories_repr_matches_seed():
    facts, _ = _linear(popxl.Ir())
    pattern = (
        r"\{'weight': <popxl_addons\.variable_factory\.VariableFactory object at "
        r"0x[0-9a-f]+>, 'bias': <popxl_addons\.variable_factory\.VariableFactory "
        r"object at 0x[0-9a-f]+>\}"
    )
    assert re.fullmatch(pattern, repr(facts))


# factories and init ------------------------------------------------------------------
def test_init_creates_variables_in_sorted_key_order_with_dedup():
    ir = popxl.Ir()
    facts, _ = _linear(ir)
    with ir.main_graph:
        v1 = facts.init()
        v2 = facts.init()
        v3 = facts.init("layer")
    assert v1.keys() == ["bias", "weight"]
    assert [t.name for t in v1.values_flat()] == ["bias", "weight"]
    # the second init dedups in sorted order: bias first
    assert [v2.bias.name, v2.weight.name] == ["bias__t0", "weight__t1"]
    assert [v3.bias.name, v3.weight.name] == ["layer.bias", "layer.weight"]


def test_factory_consumes_rng_twice_at_construction():
    np.random.seed(42)
    ir = popxl.Ir()
    facts, _ = _linear(ir)
    with ir.main_graph:
        v1, v2 = facts.init(), facts.init()
    np.random.seed(42)
    draws = [np.random.normal(0, 0.02, (4, 32)) for _ in range(3)]
    session = popxl.Session(ir, "ipu_hw")
    np.testing.assert_array_equal(session.get_tensor_data(v1.weight), draws[1].astype(np.float32))
    np.testing.assert_array_equal(session.get_tensor_data(v2.weight), draws[2].astype(np.float32))


def test_factory_data_function_raising_names_the_variable():
    def bad():
        raise RuntimeError("no data")

    ir = popxl.Ir()
    with ir.main_graph, pytest.raises(ValueError, match=r"throws error.*'w'.*no data"):
        addons.VariableFactory(bad, popxl.float32, name="w")


def test_factory_needs_graph_context_and_infers_dtype():
    with pytest.raises(RuntimeError, match="graph context"):
        addons.VariableFactory(partial(np.zeros, 3), name="v")
    ir = popxl.Ir()
    with ir.main_graph:
        f64 = addons.VariableFactory(partial(np.zeros, 3))
        i32 = addons.VariableFactory(iter([np.arange(3, dtype=np.int32)]))
    assert f64.dtype is popxl.float32 and i32.dtype is popxl.int32 and i32.shape == (3,)
    with ir.main_graph:
        i32.create_tensor("a")
        with pytest.raises(ValueError, match="exhausted"):
            i32.create_tensor("b")


def test_init_zero_in_a_subgraph():
    ir = popxl.Ir()
    facts, _ = _linear(ir, out=3)

    def body():
        zeros = facts.init_zero()
        assert zeros.keys() == ["weight", "bias"]
        assert zeros.weight.graph is popxl.gcg() and zeros.weight.name == "weight"
        return zeros.weight

    with ir.main_graph:
        g = ir.create_graph(body)
        (w,) = ops.call(g)
        out = popxl.d2h_stream(w.shape, w.dtype, "w")
        ops.host_store(out, w)
    session = popxl.Session(ir, "ipu_hw")
    with session:
        np.testing.assert_array_equal(session.run()[out], np.zeros((4, 3), np.float32))


# add_variable_input ----------------------------------------------------------------
class _Twice(addons.Module):
    def build(self, x):
        self.add_variable_input("w", partial(np.ones, x.shape), x.dtype)
        self.add_variable_input("w", partial(np.ones, x.shape), x.dtype)
        return x


def test_add_variable_input_outside_build_raises():
    module = Linear(2)
    with pytest.raises(RuntimeError, match="outside graph construction"):
        module.add_variable_input("w", partial(np.zeros, 2))
    ir = popxl.Ir()
    with ir.main_graph, pytest.raises(RuntimeError, match="outside graph construction"):
        module.add_variable_input("w", partial(np.zeros, 2))


def test_duplicate_and_invalid_named_inputs():
    ir = popxl.Ir()
    with ir.main_graph, pytest.raises(ValueError, match="already has a named input 'w'"):
        _Twice().create_graph(SPEC)

    class Bad(addons.Module):
        def build(self, x):
            self.add_variable_input(".w", partial(np.ones, 2))
            return x

    with ir.main_graph, pytest.raises(ValueError, match="Invalid DotTree key"):
        Bad().create_graph(SPEC)


def test_failed_build_resets_module_state():
    module = _Twice()
    ir = popxl.Ir()
    with ir.main_graph, pytest.raises(ValueError):
        module.create_graph(SPEC)
    assert module._variable_factories.len_flat() == 0


def test_submodule_without_super_init_is_reported():
    class NoInit(addons.Module):
        def __init__(self):
            self.fc = Linear(2)

    with pytest.raises(RuntimeError, match="super"):
        NoInit()


def test_nested_submodule_names_and_graph_input_scopes():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, graph = Net().create_graph(popxl.TensorSpec((28, 28), popxl.float32))
    assert graph.args.fc2.weight.name == "fc2/weight"
    assert facts.fc3.bias.shape == (512,)
    with ir.main_graph:
        names = [t.name for t in facts.init().tensors]
    assert names == sorted(f"fc{i}.{p}" for i in range(1, 5) for p in ("weight", "bias"))


# bind / call -------------------------------------------------------------------------
def test_bind_missing_names_are_reported_at_the_call():
    ir = popxl.Ir()
    facts, graph = _linear(ir)
    with ir.main_graph:
        variables = facts.init()
        x = popxl.variable(np.zeros((2, 4), np.float32))
        wrong = addons.NamedTensors(weight=variables.weight, bais=variables.bias)
        bound = graph.bind(wrong)
        with pytest.raises(ValueError, match=r"\['bias'\].*\['bais'\]"):
            bound.call(x)
        # passing the missing input at the call site is fine
        (y,) = bound.call(x, args={graph.args.bias: variables.bias})
    assert y.shape == (2, 32)


def test_bind_accepts_supersets_and_rejects_non_mappings():
    ir = popxl.Ir()
    facts, graph = _linear(ir)
    with ir.main_graph:
        variables = facts.init()
        extra = variables.copy()
        extra.insert("unused", variables.bias)
        bound = graph.bind(extra)
        assert bound.args == {graph.args.weight: variables.weight, graph.args.bias: variables.bias}
        with pytest.raises(TypeError, match="NamedTensors"):
            graph.bind([variables.weight])
        x = popxl.variable(np.zeros((2, 4), np.float32))
        (y,) = graph.call(x, variables.weight, variables.bias)
    assert y.shape == (2, 32)
    assert re.fullmatch(r"<popxl_addons\.graph\.BoundGraph object at 0x[0-9a-f]+>", repr(bound))


def test_bound_graph_bind_merges_and_subgraph_io_map():
    ir = popxl.Ir()
    facts, graph = _linear(ir)
    with ir.main_graph:
        variables = facts.init()
        x = popxl.variable(np.zeros((2, 4), np.float32))
        bound = addons.BoundGraph(graph.graph).bind({graph.args.weight: variables.weight})
        bound = bound.bind({graph.args.bias: variables.bias})
        io = bound.subgraph_io_map(x)
        info = bound.call_with_info(x)
    assert io == {
        graph.graph.inputs[0]: x,
        graph.args.weight: variables.weight,
        graph.args.bias: variables.bias,
    }
    assert info.called_graph == graph.graph


# autodiff ----------------------------------------------------------------------------
def test_autodiff_twice_needs_force_and_grad_info_only_on_grad_graphs():
    ir = popxl.Ir()
    _, graph = _linear(ir)
    with pytest.raises(AttributeError, match="not a gradient graph"):
        _ = graph.grad_graph_info
    grad = graph.autodiff()
    assert grad.grad_graph_info.forward_graph == graph.graph
    assert grad.args.len_flat() == 0 and grad.graph.name == "Linear_subgraph(0)_bwd"
    with pytest.raises(RuntimeError, match="already been applied"):
        graph.autodiff()
    assert graph.autodiff(force=True).graph.name == "Linear_subgraph(0)_bwd_0"


def test_addons_autodiff_marks_forward_graph_and_accepts_plain_graphs():
    ir = popxl.Ir()
    _, graph = _linear(ir)
    grad = addons.autodiff(graph)
    assert graph.autodiff_applied
    assert {c.connection_type.name for c in grad.grad_graph_info.expected_outputs} == {"FwdGrad"}
    assert [c.fwd_tensor for c in grad.grad_graph_info.expected_outputs] == list(graph.graph.inputs)
    with ir.main_graph:
        plain = ir.create_graph(lambda a: a * a, popxl.TensorSpec((2,), popxl.float32))
    assert addons.autodiff(plain).grad_graph_info.forward_graph == plain


# caching -----------------------------------------------------------------------------
def test_module_cache_reuses_graph_and_returns_factories():
    ir = popxl.Ir()
    module = Linear(8)
    module._graph_cache = addons.GraphCache()
    with ir.main_graph:
        x = popxl.variable(np.zeros((2, 4), np.float32))
        f1, g1 = module.create_graph(x)
        f2, g2 = module.create_graph(x.spec)
        f3, g3 = module.create_graph(popxl.TensorSpec((3, 4), popxl.float32))
    assert g1.graph is g2.graph and g3.graph is not g1.graph
    assert f2.keys_flat() == ["weight", "bias"] and g2.args.weight is g1.args.weight
    assert len(ir._pb_ir.getAllGraphs()) == 3  # main + two Linear graphs


def test_graph_cache_keys_on_placement_and_values():
    def scale(x, factor):
        return x * factor

    cache = addons.GraphCache()
    ir = popxl.Ir()
    with ir.main_graph:
        spec = popxl.TensorSpec((2,), popxl.float32)
        a = cache.create_graph(scale, spec, 2.0)
        assert cache.create_graph(scale, spec, 2.0) is a
        assert cache.create_graph(scale, spec, 3.0) is not a
        with popxl.ipu(1):
            assert cache.create_graph(scale, spec, 2.0) is not a
        # an unhashable argument is traced every time instead of failing
        b = cache.create_graph(scale, spec, np.float32([2.0, 2.0]))
        assert cache.create_graph(scale, spec, np.float32([2.0, 2.0])) is not b


def test_function_decorator_outlines_once():
    @addons.function
    def double(x):
        return x + x

    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones(3, np.float32))
        (y1,) = double(a)
        (y2,) = double(y1)
    calls = [op for op in ir.main_graph.ops if op.type == "Call"]
    assert len(calls) == 2 and calls[0].called_graphs == calls[1].called_graphs
    assert y2.shape == (3,)


# outlining helpers -------------------------------------------------------------------
class _Stack(addons.Module):
    def __init__(self):
        super().__init__()
        self.layers = addons.Module.from_list([Linear(4), Linear(4)])

    def build(self, x):
        for i, layer in enumerate(self.layers):
            x = self.call_module(layer, name=f"layer{i}")(x)[0]
        return x


def test_call_module_and_from_list():
    ir = popxl.Ir()
    stack = _Stack()
    assert len(stack.layers) == 2 and stack.layers[-1] is stack.get("layers.1")
    with ir.main_graph:
        facts, graph = stack.create_graph(popxl.TensorSpec((2, 4), popxl.float32))
    assert facts.keys_flat() == ["layer0.weight", "layer0.bias", "layer1.weight", "layer1.bias"]
    calls = [op for op in graph.graph.ops if op.type == "Call"]
    assert [op.called_graphs[0].name for op in calls] == [
        "Linear_subgraph(1)",
        "Linear_subgraph(2)",
    ]
    with pytest.raises(TypeError):
        iter(Linear(2))


def test_every_module_is_truthy_as_in_popxl():
    # `if self.ln:` in Graphcore's apps, with ln a module or None
    assert Linear(2) and addons.Module.from_list([])


# custom gradients --------------------------------------------------------------------
class _Square(addons.Module):
    """y = x * w; a deliberately scaled custom gradient so the test can tell it was used."""

    def build(self, x):
        w = self.add_variable_input("w", partial(np.full, x.shape, 3.0), x.dtype)
        self.aux["x"] = x
        self.aux["w"] = w
        return x * w

    def build_grad(self, dy):
        self.var_grad["w"] = dy * self.aux["x"] * 10.0
        return dy * self.aux["w"]


class _UsesSquare(addons.Module):
    def __init__(self):
        super().__init__()
        self.sq = _Square()

    def build(self, x):
        return self.call_module(self.sq)(x)[0]


def test_custom_gradient_is_used_through_call_module():
    ir = popxl.Ir()
    x_data = np.array([1.0, 2.0], np.float32)
    with ir.main_graph:
        facts, fwd = _UsesSquare().create_graph(popxl.TensorSpec((2,), popxl.float32))
        assert fwd.called_graphs_grad_info
        bwd = addons.autodiff(fwd)
        variables = facts.init()
        x = popxl.variable(x_data, name="x")
        info = fwd.bind(variables).call_with_info(x)
        dy = popxl.constant(np.ones(2, np.float32))
        grad_info = bwd.call_with_info(dy, args=bwd.grad_graph_info.inputs_dict(info))
        grads = bwd.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(info, grad_info)
        outs = {k: popxl.d2h_stream((2,), popxl.float32, k) for k in ("dx", "dw")}
        ops.host_store(outs["dx"], grads[x])
        ops.host_store(outs["dw"], grads[variables.sq.w])
    session = popxl.Session(ir, "ipu_hw")
    with session:
        result = session.run()
    np.testing.assert_allclose(result[outs["dx"]], [3.0, 3.0])
    np.testing.assert_allclose(result[outs["dw"]], x_data * 10.0)


class _SquarePopxlGrad(addons.Module):
    """y = x * w differentiated by popxl (no custom gradient)."""

    def build(self, x):
        return x * self.add_variable_input("w", partial(np.full, x.shape, 3.0), x.dtype)


@pytest.mark.parametrize("pick", ["function", "none"])
def test_call_module_grads_required_may_be_a_function_of_the_callee_graph(pick):
    # popxl.addons takes `grads_required=lambda graph: graph.graph.inputs[:1]` (GPT-3 2.7B's
    # MNLI head): the callee's tensors exist only once call_module has built its graph
    required = (lambda g: g.graph.inputs[:1]) if pick == "function" else None

    class Caller(addons.Module):
        def build(self, x):
            call = self.call_module(
                _SquarePopxlGrad(), autodiff="autodiff", grads_required=required
            )
            return call(x)[0]

    ir = popxl.Ir()
    with ir.main_graph:
        _, graph = Caller().create_graph(popxl.TensorSpec((2,), popxl.float32))
    ((callee, info),) = graph.called_graphs_grad_info.items()
    produced = [c.fwd_tensor for c in info.expected_outputs]
    assert produced == (list(callee.inputs[:1]) if required else list(callee.inputs))


def test_inlining_a_module_with_build_grad_is_an_error_by_default():
    class Inline(addons.Module):
        def __init__(self, mode):
            super().__init__()
            self.sq = _Square()
            self.sq.grad_inlining_error = mode

        def build(self, x):
            return self.sq(x)

    ir = popxl.Ir()
    with ir.main_graph:
        with pytest.raises(RuntimeError, match="build_grad"):
            Inline("error").create_graph(popxl.TensorSpec((2,), popxl.float32))
        with pytest.warns(UserWarning, match="build_grad"):
            Inline("warning").create_graph(popxl.TensorSpec((2,), popxl.float32))
    with pytest.raises(ValueError, match="cache"):
        _Square.__new__(_Square).__init__(cache=True)


def test_outlined_net_module_is_reusable():
    ir = popxl.Ir()
    module = NetOutlined()
    with ir.main_graph:
        spec = popxl.TensorSpec((28, 28), popxl.float32)
        f1, g1 = module.create_graph(spec)
        f2, g2 = module.create_graph(spec)
    assert f1.keys_flat() == f2.keys_flat() and g1.graph is not g2.graph


def test_add_variable_inputs_names_graph_inputs_by_prefix_and_key():
    ir = popxl.Ir()
    with ir.main_graph:
        _, graph = NetOutlined().create_graph(popxl.TensorSpec((28, 28), popxl.float32))
    assert graph.args.fc2.weight.name == "fc2.weight"
    assert graph.args.fc3.bias.name == "fc3.bias"
    assert graph.args.fc1.bias.name == "fc1/bias"  # inlined submodule: name scope

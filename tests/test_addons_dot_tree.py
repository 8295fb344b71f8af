"""DotTree / NamedTensors semantics (popxl_api.md §4.3, §7), one rule per test."""

import numpy as np
import pytest

import addons
import popxl_core as popxl
from addons.dot_tree import DotTree, sanitise, to_mapping


def tree(**kw):
    return DotTree.from_dict(kw)


def test_dotted_keys_nest_and_attribute_access():
    t = DotTree.from_dict({"a.b": 1, "a.c": 2, "d": 3})
    assert isinstance(t.a, DotTree)
    assert (t.a.b, t["a.c"], t.get("d"), t.a["c"]) == (1, 2, 3, 2)
    assert t.keys() == ["a", "d"] and len(t) == 2 and t.len_flat() == 3


def test_int_keys_are_stored_as_strings():
    t = DotTree()
    t.insert(0, "x")
    t.insert("1", "y")
    assert t.keys() == ["0", "1"]
    assert t[0] == "x" and t["0"] == "x" and t[1] == "y"


def test_negative_index_counts_from_largest_numeric_key():
    t = DotTree.from_dict({0: "a", 1: "b", 3: "d"})
    assert t[-1] == "d"
    assert t[-3] == "b"
    with pytest.raises(KeyError):
        t[-2]  # '2' is missing
    with pytest.raises(KeyError):
        t[-5]


@pytest.mark.parametrize("key", [".a", "-1", "a..b", "a.", "a-b", "1.x y", ""])
def test_invalid_string_keys_raise_value_error(key):
    with pytest.raises(ValueError, match="Invalid DotTree key"):
        DotTree().insert(key, 1)


def test_negative_int_insert_and_bad_key_types():
    with pytest.raises(ValueError):
        DotTree().insert(-1, 1)
    with pytest.raises(TypeError):
        DotTree().insert(1.5, 1)


def test_missing_key_and_attribute_errors_list_the_keys():
    t = tree(alpha=1, beta=2)
    with pytest.raises(KeyError, match="alpha"):
        t.get("gamma")
    with pytest.raises(AttributeError, match=r"gamma.*\['alpha', 'beta'\]"):
        _ = t.gamma
    with pytest.raises(KeyError):
        t.get("alpha.x")  # alpha is a leaf


def test_insert_existing_key_needs_overwrite():
    t = tree(a=1)
    with pytest.raises(ValueError, match="already exists"):
        t.insert("a", 2)
    t.insert("a", 2, overwrite=True)
    assert t.a == 2


def test_overwrite_merges_nested_trees():
    t = DotTree.from_dict({"a.x": 1, "a.y": 2})
    t.insert("a", DotTree.from_dict({"y": 20, "z": 30}), overwrite=True)
    assert t.to_dict() == {"a.x": 1, "a.y": 20, "a.z": 30}


def test_failed_nested_insert_leaves_tree_unchanged():
    t = DotTree.from_dict({"a.b": 1})
    before = t.a
    with pytest.raises(ValueError):
        t.insert("a.b.c", 2)  # a.b is a leaf
    with pytest.raises(ValueError):
        t.insert("a.b", 3)
    assert t.to_dict() == {"a.b": 1} and t.a is before
    with pytest.raises(ValueError, match="overwrite=True to merge"):
        t.insert("a.c", 4)  # popxl.addons: an existing top-level key needs overwrite=True
    assert t.to_dict() == {"a.b": 1} and t.a is before
    with pytest.raises(ValueError):
        t.insert("a.b.c", 2, overwrite=True)  # a leaf never becomes a sub-tree
    t.insert("a.c", 4, overwrite=True)
    assert t.to_dict() == {"a.b": 1, "a.c": 4}


def test_update_copies_and_rejects_duplicates():
    t = tree(a=1)
    other = DotTree.from_dict({"b.c": 2})
    t.update(other)
    assert t.to_dict() == {"a": 1, "b.c": 2}
    assert t.b is not other.b
    with pytest.raises(ValueError):
        t.update(tree(a=5))


def test_pop_removes_nested_key():
    t = DotTree.from_dict({"a.b": 1, "a.c": 2})
    assert t.pop("a.b") == 1
    assert t.to_dict() == {"a.c": 2}
    with pytest.raises(KeyError):
        t.pop("a.b")


def test_copy_copies_subtrees_and_shares_leaves():
    leaf = object()
    t = DotTree.from_dict({"a.b": leaf})
    c = t.copy()
    assert c.a is not t.a and c.a.b is leaf
    c.insert("a.z", 1, overwrite=True)
    assert "a.z" not in t


def test_filter_keys_and_duplicates():
    t = DotTree.from_dict({"a.b": 1, "a.c": 2, "d": 3})
    f = t.filter_keys(["d", "a.c"])
    assert f.to_dict() == {"d": 3, "a.c": 2}
    with pytest.raises(ValueError, match="duplicate"):
        t.filter_keys(["d", "d"])


def test_to_dict_is_insertion_order_and_unpack_is_sorted_by_key():
    t = DotTree.from_dict({"z": 1, "b.y": 2, "b.a": 3, "a": 4})
    assert list(t.to_dict()) == ["z", "b.y", "b.a", "a"]
    assert t.keys_flat() == ["z", "b.y", "b.a", "a"] and t.values_flat() == [1, 2, 3, 4]
    keys, values = t.unpack()
    assert keys == ("a", "b.a", "b.y", "z") and values == (4, 3, 2, 1)


def test_unpack_of_empty_tree_and_pack_round_trip():
    assert DotTree().unpack() == ([], [])
    t = DotTree.pack(["x.y", "w"], [1, 2])
    assert t.to_dict() == {"x.y": 1, "w": 2}
    with pytest.raises(ValueError):
        DotTree.pack(["a"], [1, 2])


def test_map_and_to_mapping_over_common_keys():
    a = DotTree.from_dict({"p.q": 1, "r": 2, "only_a": 3})
    b = DotTree.from_dict({"r": "R", "p.q": "Q", "only_b": "B"})
    assert a.map(lambda v: v * 10).to_dict() == {"p.q": 10, "r": 20, "only_a": 30}
    assert a.to_mapping(b) == {1: "Q", 2: "R"} == to_mapping(a, b)


def test_contains():
    t = DotTree.from_dict({"a.b": 1})
    assert "a" in t and "a.b" in t and "a.c" not in t and "-1" not in t


def test_clear_keeps_subtree_objects():
    shared = DotTree.from_dict({"w": 1})
    t = DotTree(sub=shared, leaf=2)
    t._clear()
    assert t.keys() == ["sub"] and t.sub is shared and len(shared) == 0
    shared.insert("w", 5)
    assert t.to_dict() == {"sub.w": 5}


def test_sanitise():
    assert sanitise("layer-1/w.b") == "layer_1_w_b"
    assert sanitise("0abc") == "_0abc"
    assert DotTree.sanitise("ok_name") == "ok_name"


def test_repr_is_the_flat_dict():
    t = DotTree.from_dict({"a.b": 1, "c": "x"})
    assert repr(t) == "{'a.b': 1, 'c': 'x'}"


def test_ordered_dict_repr_and_idx():
    d = addons.OrderedDict(a=1, b=2)
    assert repr(d) == "{\na: 1,\nb: 2,\n}" and repr(addons.OrderedDict()) == "{}"
    assert d.idx(-1) == 2  # popxl.addons' idx gives the value (gpt3_175B's pretraining reads it)
    assert type(d.keys()).__name__ == "dict_keys"


def _variables(*names):
    ir = popxl.Ir()
    with ir.main_graph:
        return ir, [popxl.variable(np.zeros(2, np.float32), name=n) for n in names]


def test_named_tensors_tensors_sorted_by_tensor_name_not_key():
    _, (w, b, c) = _variables("weight", "bias", "counter")
    nt = addons.NamedTensors(z=b, a=w)
    nt.insert("m.k", c)
    assert nt.tensors == (b, c, w)
    assert nt.named_tensors == {"z": b, "a": w, "m.k": c}
    assert type(nt.named_tensors) is dict


def test_named_tensors_repr_matches_seed_format():
    _, (b, w) = _variables("bias", "weight")
    nt = addons.NamedTensors(bias=b, weight=w)
    assert repr(nt) == (
        "{'bias': Tensor[bias popxl.dtypes.float32 (2,)], "
        "'weight': Tensor[weight popxl.dtypes.float32 (2,)]}"
    )


def test_named_tensors_remap_swaps_leaves():
    _, (a, b, c, d) = _variables("a", "b", "c", "d")
    nt = addons.NamedTensors.from_dict({"x.y": a, "z": b})
    out = nt.remap({a: c, b: d})
    assert isinstance(out, addons.NamedTensors) and out.to_dict() == {"x.y": c, "z": d}
    assert nt.remap({a: c}).to_dict() == {"x.y": c}


def test_subtrees_keep_the_class():
    t = addons.NamedTensors.from_dict({})
    t.insert("a.b", 1)
    assert type(t.a) is addons.NamedTensors
    assert type(t.copy()) is addons.NamedTensors


def test_trees_are_truthy_when_empty_and_len_counts_top_level_keys():
    t = DotTree.from_dict({"a.b": 1, "a.c": 2, "d": 3})
    assert t.len() == len(t) == 2
    t._clear()
    assert t.a and t.a.len() == 0 and t.to_dict() == {}  # sub-tree objects stay, emptied
    assert DotTree()


def test_insert_in_place_matches_insert():
    # the same sequence of inserts through both paths gives the same tree and the same errors
    keys = ["a.b.c", "a.b.d", "a.e", "f", "a.b.c", "g.0.h", "g.1"]
    copying, in_place = DotTree(), DotTree()
    for i, k in enumerate(keys):
        copying.insert(k, i, overwrite=True)
        in_place._insert_in_place(k, i, overwrite=True)
    assert (
        in_place.to_dict()
        == copying.to_dict()
        == {"a.b.c": 4, "a.b.d": 1, "a.e": 2, "f": 3, "g.0.h": 5, "g.1": 6}
    )
    sub = in_place.a
    in_place._insert_in_place("a.z", 9, overwrite=True)
    assert in_place.a is sub and sub.z == 9  # no copy swapped in
    for key, overwrite in (("a.b.c.x", True), ("a.q", False), ("f", False)):
        with pytest.raises(ValueError) as want:
            DotTree.from_dict(copying.to_dict()).insert(key, 0, overwrite)
        with pytest.raises(ValueError) as got:
            in_place._insert_in_place(key, 0, overwrite)
        assert str(got.value) == str(want.value)
    merged = DotTree.from_dict({"m.x": 1})
    merged._insert_in_place("m", DotTree.from_dict({"y": 2}), overwrite=True)
    assert merged.to_dict() == {"m.x": 1, "m.y": 2}

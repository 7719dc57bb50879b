"""Status patches remove what the new status no longer has."""

from llmtrain_operator.k8s.patches import merge_patch


def apply(doc, patch):
    """RFC 7386 application, to check the patch reproduces the new document."""
    out = dict(doc)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = apply(out[key], value)
        else:
            out[key] = value
    return out


def test_removed_fields_become_explicit_nulls_at_any_depth():
    old = {"phase": "Running", "lastRecoverySeconds": 15.2, "lastFailure": {"kind": "X", "exitCode": 137}, "step": 3}
    new = {"phase": "Running", "lastFailure": {"kind": "NodeFailure"}, "step": 4}
    patch = merge_patch(old, new)
    assert patch == {"lastRecoverySeconds": None, "lastFailure": {"kind": "NodeFailure", "exitCode": None}, "step": 4}
    assert apply(old, patch) == new


def test_identical_documents_give_an_empty_patch_and_lists_are_replaced_whole():
    doc = {"conditions": [{"type": "Running"}], "replicas": {"ready": 1}}
    assert merge_patch(doc, doc) == {}
    assert merge_patch(doc, {**doc, "conditions": []}) == {"conditions": []}

"""The k8s.io/kube-scheduler/extender/v1 JSON: the bodies kube-scheduler sends, read; the answers it decodes, written.

kube-scheduler marshals the v1 structs, which have no JSON tags, so it sends Go's field names with a null for the
form it does not use (the shape of the v1 package's own TestCompatibility); extenders built on the older
pkg/scheduler/api/v1 types send and expect lower-case tags. Both are read.
"""

from __future__ import annotations

import orjson
import pytest

from epp.errors import InvalidJson, InvalidShape
from epp.extender.api import error_result, filter_result, parse_args, priority_list

POD = (b'{"metadata":{"name":"vllm-decode-7d9f-x2x","namespace":"llm","uid":"9b1c","labels":{"app":"vllm",'
       b'"llm-d.ai/role":"decode"},"creationTimestamp":null},"spec":{"containers":[{"name":"vllm","image":'
       b'"vllm/vllm-openai:v0.10.0","resources":{"limits":{"nvidia.com/gpu":"1"}}}],"schedulerName":'
       b'"default-scheduler"},"status":{"phase":"Pending"}}')

NODE_A = (b'{"metadata":{"name":"gpu-a","uid":"n-a","labels":{"kubernetes.io/hostname":"gpu-a"},'
          b'"creationTimestamp":null},"spec":{"podCIDR":"10.244.1.0/24"},"status":{"capacity":{"nvidia.com/gpu":"8"},'
          b'"daemonEndpoints":{"kubeletEndpoint":{"Port":10250}},"nodeInfo":{"machineID":"","systemUUID":"",'
          b'"bootID":"","kernelVersion":"","osImage":"","containerRuntimeVersion":"","kubeletVersion":"v1.32.0",'
          b'"kubeProxyVersion":"","operatingSystem":"linux","architecture":"amd64"}}}')
NODE_B = NODE_A.replace(b"gpu-a", b"gpu-b").replace(b"n-a", b"n-b").replace(b"10.244.1.", b"10.244.2.")

NAMES_BODY = b'{"Pod":' + POD + b',"Nodes":null,"NodeNames":["gpu-a","gpu-b","cpu-c"]}'
LIST_BODY = b'{"Pod":' + POD + b',"Nodes":{"metadata":{},"items":[' + NODE_A + b',' + NODE_B + b']},"NodeNames":null}'
LEGACY_NAMES_BODY = b'{"pod":' + POD + b',"nodenames":["gpu-a","gpu-b"]}'
LEGACY_LIST_BODY = b'{"pod":' + POD + b',"nodes":{"items":[' + NODE_A + b',' + NODE_B + b']}}'


def test_node_names_form_as_kube_scheduler_sends_it() -> None:
    args = parse_args(NAMES_BODY)
    assert args.nodes == ["gpu-a", "gpu-b", "cpu-c"] and args.node_list is None
    assert args.pod["metadata"]["labels"]["llm-d.ai/role"] == "decode"
    assert orjson.loads(filter_result(args, ["gpu-b", "cpu-c"], {"gpu-a": "saturated"})) == {
        "NodeNames": ["gpu-b", "cpu-c"], "FailedNodes": {"gpu-a": "saturated"}, "FailedAndUnresolvableNodes": {},
        "Error": ""}


def test_node_list_form_answers_the_passed_nodes_unchanged() -> None:
    args = parse_args(LIST_BODY)
    assert args.nodes == ["gpu-a", "gpu-b"] and args.node_names is None
    result = orjson.loads(filter_result(args, ["gpu-b"], {"gpu-a": "saturated"}))
    assert result == {"Nodes": {"metadata": {}, "items": [orjson.loads(NODE_B)]}, "FailedNodes": {"gpu-a": "saturated"},
                      "FailedAndUnresolvableNodes": {}, "Error": ""}


@pytest.mark.parametrize("body, nodes", [(LEGACY_NAMES_BODY, ["gpu-a", "gpu-b"]), (LEGACY_LIST_BODY, ["gpu-a", "gpu-b"]),
                                         (b'{"POD":{},"NODENAMES":["n"]}', ["n"]),
                                         (b'{"Pod":{},"NodeNames":["old"],"nodenames":["new"],"extra":1}', ["new"])],
                         ids=["lower-case-names", "lower-case-list", "any-case", "last-key-wins"])
def test_field_names_match_case_insensitively_as_in_go(body: bytes, nodes: list[str]) -> None:
    assert parse_args(body).nodes == nodes


def test_both_forms_are_answered_in_both_forms() -> None:
    args = parse_args(b'{"Pod":{},"NodeNames":["gpu-a"],"Nodes":{"items":[' + NODE_A + b']}}')
    result = orjson.loads(filter_result(args, [], {"gpu-a": "x"}))
    assert result["NodeNames"] == [] and result["Nodes"]["items"] == []


def test_an_empty_candidate_list_gives_an_empty_list_not_null() -> None:
    # kube-scheduler treats a missing NodeNames as "no node passed" anyway, but [] says it plainly
    assert orjson.loads(filter_result(parse_args(b'{"Pod":{},"NodeNames":[]}'), [], {}))["NodeNames"] == []


def test_priority_list_and_error_result() -> None:
    assert orjson.loads(priority_list([("gpu-a", 0), ("gpu-b", 10)])) == [{"Host": "gpu-a", "Score": 0},
                                                                          {"Host": "gpu-b", "Score": 10}]
    assert orjson.loads(error_result("not synced")) == {"FailedNodes": {}, "Error": "not synced"}


@pytest.mark.parametrize("body, error, words", [
    (b"{not json", InvalidJson, "not JSON"),
    (b"", InvalidJson, "not JSON"),
    (b'["Pod"]', InvalidShape, "expected a JSON object, got an array"),
    (b'{"NodeNames":["a"]}', InvalidShape, "Pod must be a v1 Pod object, got null"),
    (b'{"Pod":"p","NodeNames":["a"]}', InvalidShape, "Pod must be a v1 Pod object, got a string"),
    (b'{"Pod":{}}', InvalidShape, "no candidate nodes"),
    (b'{"Pod":{},"Nodes":null,"NodeNames":null}', InvalidShape, "no candidate nodes"),
    (b'{"Pod":{},"NodeNames":"gpu-a"}', InvalidShape, "NodeNames must be a list of node names, got a string"),
    (b'{"Pod":{},"NodeNames":["a",1]}', InvalidShape, "NodeNames must be a list of node names"),
    (b'{"Pod":{},"Nodes":[]}', InvalidShape, "Nodes must be a v1 NodeList object, got an array"),
    (b'{"Pod":{},"Nodes":{"items":{}}}', InvalidShape, "Nodes.items must be a list"),
    (b'{"Pod":{},"Nodes":{"items":[{"metadata":{}}]}}', InvalidShape, "Nodes.items[0] is not a v1 Node"),
    (b'{"Pod":{},"Nodes":{"items":[7]}}', InvalidShape, "Nodes.items[0] is not a v1 Node"),
], ids=["broken", "empty", "array", "no-pod", "pod-string", "no-nodes", "both-null", "names-string", "names-mixed",
        "list-array", "items-object", "node-without-name", "node-number"])
def test_bad_bodies_name_what_is_wrong(body: bytes, error: type[Exception], words: str) -> None:
    with pytest.raises(error) as caught:
        parse_args(body)
    assert words in str(caught.value)

"""The memory plan against the GPUs a job can land on (``policies/memory.py``): advice on
the job, from the nodes' GPU feature discovery labels."""

from __future__ import annotations

from llmtrain_operator.api.observed import NodeView, node_view, slim_node
from llmtrain_operator.planner import plan
from support.planning import NOW, job, observed, running_status, worker

GPU_JOB = {"spec.resources": {"limits": {"nvidia.com/gpu": 8}}, "spec.procsPerNode": 8,
           "spec.trainer.builtin.model": {"preset": "gpt-1.3b"}, "spec.trainer.builtin.data": {"seqLen": 1024},
           "spec.trainer.builtin.microBatchSize": 16, "spec.trainer.builtin.globalBatchSize": 256}


def gpu_node(name: str, mib: int | None, product: str = "NVIDIA-H100-80GB-HBM3") -> NodeView:
    return NodeView(name, "True", NOW, gpu_memory_mib=mib, gpu_product=product)


def fits(raw, nodes):
    result = plan(raw, observed(raw, [worker(0), worker(1)], nodes=nodes), NOW)
    return {c["type"]: c for c in result.status["conditions"]}.get("GPUMemoryFits"), result


def test_a_job_too_big_for_the_largest_gpu_is_told_what_would_fit():
    raw = job(GPU_JOB, status=running_status())
    cond, result = fits(raw, [gpu_node("a", 24576, "NVIDIA-L4"), gpu_node("b", 40960, "NVIDIA-A100-SXM4-40GB")])
    assert cond["status"] == "False" and cond["reason"] == "ExceedsGPUMemory"
    assert "does not fit the largest GPU the job can land on, 40 GiB (NVIDIA-A100-SXM4-40GB on node b)" in cond["message"]
    assert "try model.activationCheckpointing: true" in cond["message"]
    assert "ExceedsGPUMemory" in [e.reason for e in result.events]
    again = plan({**raw, "status": result.status}, observed(raw, [worker(0), worker(1)], nodes=[gpu_node("b", 40960)]), NOW)
    assert "ExceedsGPUMemory" not in [e.reason for e in again.events]  # an Event when it flips, not per pass


def test_the_same_job_fits_an_h200_and_says_so():
    raw = job(GPU_JOB, status=running_status())
    cond, result = fits(raw, [gpu_node("a", 143771, "NVIDIA-H200")])
    assert cond["status"] == "True" and cond["reason"] == "FitsGPUMemory" and "NVIDIA-H200 on node a" in cond["message"]
    assert "ExceedsGPUMemory" not in [e.reason for e in result.events]


def test_the_nodeselectors_product_narrows_the_candidates():
    raw = job({**GPU_JOB, "spec.scheduling": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}}}, status=running_status())
    cond, _ = fits(raw, [gpu_node("big", 143771, "NVIDIA-H200"), gpu_node("small", 24576, "NVIDIA-L4")])
    assert cond["status"] == "False" and "node small" in cond["message"]


def test_no_condition_without_labelled_nodes_or_for_a_cpu_job():
    raw = job(GPU_JOB, status=running_status())
    assert fits(raw, [gpu_node("a", None)])[0] is None
    cpu = job(status=running_status())
    assert fits(cpu, [gpu_node("a", 24576)])[0] is None


def test_the_node_view_keeps_the_gpu_labels_and_refuses_bad_values():
    node = {"metadata": {"name": "n", "labels": {"nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                                 "other": "dropped"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    slim = slim_node(node)
    assert slim["metadata"]["labels"] == {"nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    view = node_view(slim)
    assert (view.gpu_memory_mib, view.gpu_product) == (81559, "NVIDIA-H100-80GB-HBM3")
    node["metadata"]["labels"].update({"nvidia.com/gpu.memory": "80GB", "nvidia.com/gpu.product": "bad product!"})
    view = node_view(node)
    assert (view.gpu_memory_mib, view.gpu_product) == (None, "")


def test_the_condition_goes_when_no_labelled_node_is_left():
    raw = job(GPU_JOB, status=running_status())
    cond, result = fits(raw, [gpu_node("b", 40960)])
    assert cond["status"] == "False"
    later, _ = fits({**raw, "status": result.status}, [gpu_node("b", None)])
    assert later is None


def test_a_lora_fine_tune_of_the_same_model_fits_where_full_training_does_not():
    # The frozen base has no gradient, optimizer state or DDP bucket: counting them would
    # send the user to ZeRO for a job that fits as it is.
    lora = job({**GPU_JOB, "spec.trainer.builtin.lora": {"rank": 16}, "spec.trainer.builtin.microBatchSize": 4},
               status=running_status())
    full = job({**GPU_JOB, "spec.trainer.builtin.microBatchSize": 4}, status=running_status())
    l4 = [gpu_node("a", 24576, "NVIDIA-L4")]
    assert fits(full, l4)[0]["status"] == "False"
    cond, _ = fits(lora, l4)
    assert cond["status"] == "True" and cond["reason"] == "FitsGPUMemory", cond["message"]

"""Recorded device facts of NVIDIA modules (what /proc/device-tree, /etc/nv_tegra_release and dpkg
report on each) and the stand-in completion of a bundle on one of them."""

from __future__ import annotations

from helpers.tensorrt_standin import make_fake_cudart, make_fake_trt
from vitedge.backends.tensorrt.device import DeviceFacts


def jetson_facts(model: str, compatible: str, l4t="36.4.0", jetpack="6.1+b123", tensorrt="10.3.0") -> DeviceFacts:
    return DeviceFacts(tensorrt=tensorrt, gpu_name="Orin", compute_capability="8.7", cuda_runtime="12.6", cuda_driver="12.6",
                       l4t=l4t, jetpack=jetpack, machine="aarch64", module=model, compatible=compatible)


# What /proc/device-tree/{model,compatible}, /etc/nv_tegra_release and dpkg report on each module.
AGX_ORIN = jetson_facts("NVIDIA Jetson AGX Orin Developer Kit", "nvidia,p3737-0000+p3701-0005 nvidia,p3701-0005 nvidia,tegra234")
ORIN_NX = jetson_facts("NVIDIA Jetson Orin NX Engineering Reference Developer Kit",
                       "nvidia,p3768-0000+p3767-0000 nvidia,p3767-0000 nvidia,tegra234")
ORIN_NANO = jetson_facts("NVIDIA Jetson Orin Nano Developer Kit", "nvidia,p3768-0000+p3767-0005 nvidia,p3767-0005 nvidia,tegra234",
                    l4t="36.3.0", jetpack="6.0+b106", tensorrt="10.3.0")
# An Orin NX module on a third-party carrier board: the model string is the carrier's, the part number is the module's.
ORIN_NX_CARRIER = jetson_facts("Acme Vision Box", "acme,visionbox nvidia,p3767-0001 nvidia,tegra234")
UNKNOWN = DeviceFacts(tensorrt="10.13.3", gpu_name="NVIDIA Thor", compute_capability="11.0", cuda_runtime="13.0",
                      cuda_driver="13.0", l4t="38.2.0", jetpack="7.0", machine="aarch64",
                      module="NVIDIA Jetson AGX Thor Developer Kit", compatible="nvidia,p3971-0000+p3834-0000 nvidia,tegra264")
JETPACK5_ORIN = jetson_facts("NVIDIA Jetson AGX Orin Developer Kit", "nvidia,p3701-0005 nvidia,tegra234", l4t="35.4.1",
                        jetpack="5.1.2-b104", tensorrt="8.5.2")
DESKTOP = DeviceFacts(tensorrt="10.7.0", gpu_name="NVIDIA GeForce RTX 4090", compute_capability="8.9", cuda_runtime="12.6",
                      cuda_driver="12.6", machine="x86_64")


def complete_with_standin(bundle, facts, **kwargs):
    """`vitedge engine` on ``facts``' device, driven by the recording TensorRT stand-in."""
    from vitedge.app.engine_completion import complete_bundle

    cudart = make_fake_cudart()
    trt = make_fake_trt(facts.tensorrt, cudart=cudart)
    return complete_bundle(bundle, trt=trt, cudart=cudart, facts=facts, measure_speed=False, **kwargs)


# The stand-in's device: a desktop-GPU-like facts record that names itself a stand-in.
STANDIN_GPU = DeviceFacts(tensorrt="10.3.0", gpu_name="Stand-in GPU (not a real device)", compute_capability="8.7",
                          cuda_runtime="12.2", cuda_driver="12.2", l4t="36.4.0", jetpack="6.1+b123", machine="aarch64")

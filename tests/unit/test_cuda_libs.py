"""kvstore_byteps.cuda_libs: finding the CUDA 11 libraries of pip's nvidia-* packages."""
import os

from kvstore_byteps import cuda_libs


def fake_tree(root, files):
    for name in files:
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").close()


def test_libraries_are_found_in_dependency_order_with_the_soname_first(tmp_path):
    site = tmp_path / "site-packages"
    fake_tree(str(site), ["nvidia/nccl/lib/libnccl.so.2", "nvidia/cudnn/lib/libcudnn.so.8",
                          "nvidia/cudnn/lib/libcudnn_ops_infer.so.8",
                          "nvidia/cublas/lib/libcublas.so.11", "nvidia/cublas/lib/libcublasLt.so.11",
                          "nvidia/cuda_runtime/lib/libcudart.so.11.0",
                          "nvidia/cuda_runtime/lib/libcudart.so.12",      # another CUDA: not ours
                          "nvidia/__init__.py"])
    roots = cuda_libs.nvidia_roots([str(tmp_path / "elsewhere"), str(site)])
    assert roots == [str(site / "nvidia")]
    found = [os.path.relpath(p, str(site)) for p in cuda_libs.library_paths(roots)]
    assert found == ["nvidia/cuda_runtime/lib/libcudart.so.11.0",
                     "nvidia/cublas/lib/libcublasLt.so.11", "nvidia/cublas/lib/libcublas.so.11",
                     "nvidia/cudnn/lib/libcudnn.so.8", "nvidia/nccl/lib/libnccl.so.2"]


def test_nothing_is_found_without_nvidia_packages(tmp_path):
    assert cuda_libs.nvidia_roots([str(tmp_path)]) == []
    assert cuda_libs.library_paths([]) == []


def test_this_environment_has_the_cpu_mxnet_so_nothing_is_preloaded_by_the_hook():
    # The CI's environment installs MXNet's CPU wheel: the hook must not load CUDA libraries.
    assert not cuda_libs.gpu_mxnet_installed()

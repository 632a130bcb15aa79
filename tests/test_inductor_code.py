"""`pt215.inductor_code`: Inductor's wrapper code for a simulated CUDA GPU, and the launches read off it (chapter 5)."""

from __future__ import annotations

import pytest

from pt215 import inductor_code, nvfp4

WRAPPER = '''
def call(self, args):
    arg0_1, arg1_1 = args
    with torch.cuda._DeviceGuard(0):
        buf0 = empty_strided_cuda((), (), torch.float32)
        triton_poi_fused_mul_0.run(arg0_1, arg1_1, buf0, 1, stream=raw_stream0)
        extern_kernels._scaled_mm(arg0_1, arg1_1, out=buf1)
        # extern_kernels.mm(a comment is not a launch)
        triton_poi_fused_mul_t_1.run(buf1, buf0, 2048, stream=raw_stream0)
    return (buf1, )

def benchmark_compiled_module(times=10, repeat=10):
    triton_poi_fused_mul_9.run(x)
'''


def test_launches_are_read_from_call_in_order():
    assert inductor_code.launches(WRAPPER) == ["triton_poi_fused_mul_0", "extern_kernels._scaled_mm",
                                               "triton_poi_fused_mul_t_1"]


def test_launches_rejects_text_that_is_not_wrapper_code():
    with pytest.raises(ValueError, match="wrapper code"):
        inductor_code.launches("print('hello')")


@pytest.mark.parametrize("target, match", [("pt215.nvfp4.decode_layer", "module:function"),
                                           ("pt215.nvfp4:no_such_function", "no function 'no_such_function'")])
def test_a_bad_target_is_named(target: str, match: str):
    with pytest.raises(ValueError, match=match):
        inductor_code.generated_code(target)


def test_a_bad_capability_is_named():
    with pytest.raises(ValueError, match="capability must be"):
        inductor_code.generated_code("pt215.nvfp4:decode_layer", capability=(10,))  # type: ignore[arg-type]


def test_decode_layer_has_six_operands_per_gemm():
    fn, operands = nvfp4.decode_layer()
    assert fn is nvfp4.decode_layer_gemms and len(operands) == 6 * len(nvfp4.DECODE_LAYER)
    with pytest.raises(ValueError, match="6 operands per GEMM"):
        nvfp4.decode_layer_gemms(*operands[:5])
    with pytest.raises(ValueError, match="rows must be a positive int"):
        nvfp4.decode_layer_operands(rows=0)


def test_layer_kernels_needs_a_gpu_and_a_known_pdl():
    with pytest.raises(ValueError, match="pdl must be"):
        nvfp4.layer_kernels("on")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        nvfp4.layer_kernels("0")


def test_launch_elements_gives_each_generated_kernel_its_size():
    assert inductor_code.launch_elements(WRAPPER) == [
        ("triton_poi_fused_mul_0", 1), ("extern_kernels._scaled_mm", None), ("triton_poi_fused_mul_t_1", 2048)]


def test_generate_many_names_a_bad_job():
    with pytest.raises(ValueError, match="at least one"):
        inductor_code.generate_many([])
    with pytest.raises(ValueError, match="capability must be"):
        inductor_code.generate_many([{"target": "pt215.nvfp4:decode_layer", "capability": (10, 0, 1)}])


def test_the_simulation_says_what_it_skips():
    doc = inductor_code.__doc__
    assert "joint_graph.lazy_init" in doc and "pad_mm" in doc and "SDPA" in doc

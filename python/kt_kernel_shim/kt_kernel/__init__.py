"""`kt_kernel` as SGLang imports it, answered by tandem: put the folder holding this package on
PYTHONPATH (the build's python-kt/) in place of KTransformers' kt-kernel, and SGLang's
`from kt_kernel import KTMoEWrapper, generate_gpu_experts_masks` runs tandem's operator
(docs/python.md, "Under SGLang")."""

from tandem import KTMoEWrapper, generate_gpu_experts_masks

__all__ = ["KTMoEWrapper", "generate_gpu_experts_masks"]

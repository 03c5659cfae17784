# marlin/marlin.cmake: the W8A16 (FP8-weight, fp16/bf16-activation) kernels; included by
# csrc_cuda/CMakeLists.txt. Each family is a separate translation unit with its own kernel symbols:
#   marlin_sm80.cu  family sm80 (sm_80 SASS + compute_80 PTX): cp.async, ldmatrix, mma.m16n8k16, fp16+bf16
#   marlin_unpack.cu family sm80: the packed weight back to [N, K] in the activation dtype (a TU of
#                   its own, so that the mm kernels' code is the same with or without it)
#   marlin_sm75.cu  family sm75 (sm_75 SASS + compute_75 PTX): register-staged loads, mma.m16n8k8, fp16
#   marlin_api.cu   family common (host code only): the qb_marlin_* entry points and their checks.
# qb_declare_variant defines QB_HAS_MARLIN_80 / QB_HAS_MARLIN_75 when the family is built; the
# dispatcher answers QB_ERR_NOT_BUILT for a family that is not.
qb_add_family_sources(common "${CMAKE_CURRENT_LIST_DIR}/marlin_api.cu")
qb_add_family_sources(sm80 "${CMAKE_CURRENT_LIST_DIR}/marlin_sm80.cu")
qb_add_family_sources(sm80 "${CMAKE_CURRENT_LIST_DIR}/marlin_unpack.cu")
qb_add_family_sources(sm75 "${CMAKE_CURRENT_LIST_DIR}/marlin_sm75.cu")
qb_declare_variant(marlin sm80)
qb_declare_variant(marlin sm75)

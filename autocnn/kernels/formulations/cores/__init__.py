"""What several formulations share: the public home of their common cores, which each formulation
imports or includes (never a peer formulation's module: tests/test_import_graph.py). Nothing here
imports a formulation.

A file lives here when more than one formulation (or an operation besides one) uses it; a file only
one formulation uses lives in that formulation's folder.

Python:
    igemm_gemm.py           the SIMT implicit-GEMM core: envelope, parameters, rules, defaults,
                            ConvIgemm (igemm, igemm_pool)
    direct_correlation.py   the direct core: envelope, parameters, rules, defaults,
                            DirectCorrelation (direct, direct_pool; its output tiling: sep_geometry)
    wgmma_gemm.py           the wgmma block GEMM: stage sizes, 3xTF32 split, rules, WgmmaGemm
                            (wgmma, tma, winograd's wgmma products; staging)
    wgmma_split_output.py   conv_fwd's and conv_bwd_data's wgmma GEMMs, split or stream-K into the
                            output, and conv_bwd_data's GEMM (wgmma; tma builds on it)
    staging.py              operands staged K-major for a tensor-core GEMM (tc, wgmma, tma)
    mma_rules.py            the mma.sync core's architecture, warp tiles, accumulators
                            (tc, tc_rows, winograd, winograd_fused)
    workspaces.py           the workspace budget of the default candidates (fft, tc, unrolled,
                            winograd) and conv_wgrad's second-pass reduction (igemm, tc)
    pool_gather.py          the pooling backward's gather per input position (window_gather,
                            act_gather)
    winograd_transforms.py  Winograd's transforms and tiles (winograd, winograd_fused)
    circular_rows.py        the circular row buffer (circular, circular_bwd)
    sep_geometry.py         the separable correlation's tiles (the four sep_* formulations, sep_conv)
    pool_blocks.py          pooling windows per block (igemm_pool, conv_pool_problems)
    channels_last.py        the channel runs of NHWC kernels: widths, when a run is whole
                            (window_gather, direct, depthwise)

Templates (found by file name, kernels/codegen.py):
    _igemm.cuh.j2, _direct.cuh.j2           the implicit-GEMM and direct cores (igemm, igemm_pool;
                                            direct, direct_pool)
    _channels_last.cuh.j2                   NHWC channel runs' loads and stores (window_gather,
                                            direct, depthwise)
    tcgemm.cuh.j2, _mma_sync.cuh.j2         the mma.sync GEMM and its instructions
    _mma_tiles.cuh.j2                       a warp's mma tiles: accumulators, partial sums, products
                                            (tcgemm.cuh.j2, tc_rows)
    _mma16_fragments.cuh.j2                 tcgemm.cuh.j2's 16-bit operands (bf16, fp16): their staging,
                                            m16n8k16 fragments and products
    wgmma_core.cuh.j2, wgmma_mainloop.cuh.j2, _wgmma_ops.cuh.j2
                                            the wgmma GEMM, its main loop and instructions
    _gemm_row_sums.cuh.j2                   the row sums of a staged A tile (_igemm, tcgemm)
    _conv_fwd_operands.cuh.j2, _bwd_data_operands.cuh.j2, _conv_wgrad_operands.cuh.j2
                                            each op's GEMM operands and epilogue, which the glues of
                                            igemm and of the tensor-core cores share; their loads
                                            (_operand_access.cuh.j2)
    gemm_operands_conv_fwd.cuh.j2, gemm_operands_conv_bwd_data.cuh.j2
                                            those operands as the tensor-core GEMMs read them (tc,
                                            wgmma, tma; igemm_pool)
    nhwc_stage_conv_fwd.cuh.j2, wgmma_stage_conv_bwd_data.cuh.j2
                                            the staging kernels
    _bwd_data_phases.cuh.j2                 conv_bwd_data's GEMM per stride phase and its kernel (igemm, tc)
    _conv_groups.cuh.j2                     a grouped or dilated problem's constants, the block's group and
                                            conv_bwd_data's tap phases (igemm, tc; the operands above)
    igemm_conv_wgrad_reduce.cu.j2           conv_wgrad's two-pass reduction (igemm, tc)
    _bias_grad.cuh.j2                       the bias gradient (fft, sep_tiles, unrolled, winograd)
    circular_rows.cuh.j2                    the circular row buffer
    _conv_pool.cuh.j2, _pool_window.cuh.j2  the pooling epilogue and windows (the conv_pool ops)
    _winograd_correlation.cuh.j2            conv_fwd and conv_bwd_data as a 3x3 correlation and its store
                                            (winograd, winograd_fused)
    _sep_tile.cuh.j2                        the separable correlation's tile (sep_register, sep_onepass,
                                            sep_twopass)
"""

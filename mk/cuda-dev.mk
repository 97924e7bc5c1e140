# mk/cuda-dev.mk — incremental build of libglmcuda.so and the cuda/tests
# programs from per-file objects, for the edit / carry / measure loop.
#
#   eval "$(scripts/install-cuda-wheels.sh)"   # nvcc 13.0 from the pinned wheels
#   make -f mk/cuda-dev.mk -j2 [OUT=.carry/cuda] [ARCH=90a]
#
# cuda/build.sh (what `glmctl build` and CI run) compiles everything in one
# nvcc command per output: the library and every test program each recompile
# all kernels (~10 minutes on two cores). Here each .cu is compiled once into
# an object and only what changed is rebuilt; the outputs are the same
# programs (the same flags and sources), linked from those objects. Any header
# change rebuilds everything (coarse, but never stale).
OUT  ?= .carry/cuda
ARCH ?= 90a
OBJ  := build/cuda-dev/obj-$(ARCH)
NVCC ?= nvcc
FLAGS := -O3 -std=c++17 -Xcompiler -fPIC -gencode=arch=compute_$(ARCH),code=sm_$(ARCH) \
         -Icuda/include -Icuda/kernels

HEADERS  := $(wildcard cuda/include/*.h cuda/kernels/*.h cuda/kernels/*.cuh cuda/runtime/*.h \
                       cuda/comm/*.h cuda/tests/*.cuh)
KERNELS  := $(patsubst cuda/kernels/%.cu,$(OBJ)/kernels/%.o,$(wildcard cuda/kernels/*.cu))
RUNTIME  := $(patsubst cuda/%.cu,$(OBJ)/%.o,$(wildcard cuda/runtime/*.cu cuda/comm/*.cu))
TESTS    := $(patsubst cuda/tests/%.cu,$(OUT)/%,$(wildcard cuda/tests/*.cu))

.PHONY: all
# Keep the test objects (make would delete them as intermediates and recompile each time).
.SECONDARY:
all: $(OUT)/libglmcuda.so $(TESTS)

$(OBJ)/%.o: cuda/%.cu $(HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(FLAGS) -c $< -o $@

$(OUT)/libglmcuda.so: $(RUNTIME) $(KERNELS)
	@mkdir -p $(OUT)
	$(NVCC) -shared -gencode=arch=compute_$(ARCH),code=sm_$(ARCH) $^ -lcublasLt -lcublas -lnccl -o $@

$(OUT)/%: $(OBJ)/tests/%.o $(KERNELS)
	@mkdir -p $(OUT)
	$(NVCC) -gencode=arch=compute_$(ARCH),code=sm_$(ARCH) $^ -lcublasLt -lcublas -o $@

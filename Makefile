# exo build. Plain make: sources are found by wildcard, so adding a module is
# adding a file. Kernel files carry their ISA in their name (*_avx512.c,
# *_avx2.c, *_amx.c) and get the matching -m flags; everything else is built
# for baseline x86-64 so the binary runs anywhere and dispatches at run time.
#
#   make                 build/exo
#   make test            layering check + unit tests + integration tests + ASan/UBSan unit tests
#                        + bounded fuzzing
#   make BUILD=dir ...   build into another folder (helpers and sanitizer builds)
#   make SANITIZE=1      -fsanitize=address,undefined
#   make CUDA=0          no CUDA plugin even where nvcc is found
#
# The CUDA backend (src/engine/cuda/*.cu) is a plugin, $(BUILD)/libexo_cuda.so,
# built when nvcc is found (/usr/local/cuda or PATH) and loaded at run time
# (engine/cuda/plugin.c): the same exo binary runs without NVIDIA's driver.
# The plugin calls back into the executable, hence -rdynamic.

BUILD    ?= build
CC       ?= gcc
OPT      ?= -O2
CSTD     := -std=c17 -D_GNU_SOURCE
WARN     := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
            -Wpointer-arith -Wno-unused-parameter
# -Wno-unused-parameter: vtable implementations and CLI handlers share one
# signature and many of them legitimately ignore some arguments.
PKGS     := jansson libpcre2-8 libutf8proc msgpack libzstd libmicrohttpd libuv libsodium libcurl libcrypto
# -fvect-cost-model=dynamic: at -O2 GCC 12 only vectorises loops whose trip
# count it knows; the element-wise kernels (head_dim, hidden size) need more.
VECTORIZE := $(if $(findstring clang,$(CC)),,-fvect-cost-model=dynamic)
CFLAGS   += $(CSTD) $(OPT) -g $(WARN) -fno-strict-aliasing $(VECTORIZE) -pthread -Isrc \
            $(shell pkg-config --cflags $(PKGS))
LDLIBS   += $(shell pkg-config --libs $(PKGS)) -ldnnl -lm -ldl -pthread
LDFLAGS  += -rdynamic

NVCC        ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
# Ampere and Hopper machine code, plus PTX the driver compiles for others.
CUDA_ARCH   ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
               -gencode arch=compute_80,code=compute_80
NVFLAGS     := -std=c++17 -O3 -g -Isrc $(CUDA_ARCH) --Werror all-warnings \
               -Xcompiler -Wall,-Wextra,-Wno-unused-parameter,-fPIC,-fvisibility=hidden
CUDA_SRC    := $(wildcard src/engine/cuda/*.cu)
CUDA_OBJ    := $(CUDA_SRC:%.cu=$(BUILD)/%.o)
CUDA_PLUGIN :=
CUDA_TRACE  :=
CUDA_HOME   ?= $(patsubst %/bin/nvcc,%,$(NVCC))
ifneq ($(NVCC),)
ifneq ($(CUDA),0)
ifneq ($(SANITIZE),1)
CUDA_PLUGIN := $(BUILD)/libexo_cuda.so
ifneq ($(wildcard $(CUDA_HOME)/include/cupti.h),)
CUDA_TRACE  := $(BUILD)/libexo_cuda_trace.so
endif
endif
endif
endif

ifeq ($(SANITIZE),1)
CFLAGS  += -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
LDFLAGS += -fsanitize=address,undefined
endif

ISA_avx512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16 -mfma -mf16c -mbmi2
ISA_avx2   := -mavx2 -mfma -mf16c
ISA_amx    := $(ISA_avx512) -mamx-tile -mamx-int8 -mamx-bf16

LIB_SRC  := $(filter-out src/cli/main.c,$(wildcard src/*/*.c src/*/*/*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(wildcard tests/unit/*.c)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

BENCH_SRC := $(wildcard bench/*.c)

.PHONY: all test unit clean fuzz asan integration bench lint
all: $(BUILD)/exo $(CUDA_PLUGIN) $(CUDA_TRACE)

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	@echo "  NVCC    $<"
	@$(NVCC) $(NVFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libexo_cuda.so: $(CUDA_OBJ)
	@echo "  LD      $@"
	@$(NVCC) -shared -o $@ $^ -lcublas

# A kernel timeline where Nsight Systems is missing (tools/cuda_kernel_trace.c):
# preloaded into exo or a bench; built with the plugin where CUPTI is there.
$(BUILD)/libexo_cuda_trace.so: tools/cuda_kernel_trace.c
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CSTD) $(OPT) $(WARN) -fPIC -shared -I$(CUDA_HOME)/include -o $@ $< \
	    -L$(CUDA_HOME)/lib -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/extras/CUPTI/lib64 -lcupti

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CFLAGS) $(if $(findstring _avx512.c,$<),$(ISA_avx512)) \
	    $(if $(findstring _avx2.c,$<),$(ISA_avx2)) $(if $(findstring _amx.c,$<),$(ISA_amx)) \
	    -MMD -MP -c $< -o $@

$(BUILD)/libexo.a: $(LIB_OBJ)
	@rm -f $@
	@echo "  AR      $@"
	@ar rcs $@ $^

$(BUILD)/exo: $(BUILD)/src/cli/main.o $(BUILD)/libexo.a
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/unit_tests: $(TEST_OBJ) $(BUILD)/libexo.a
	@echo "  LD      $@"
	@$(CC) $(LDFLAGS) -o $@ $^ -lcriterion $(LDLIBS)

unit: $(BUILD)/unit_tests $(BUILD)/exo $(CUDA_PLUGIN) $(CUDA_TRACE)
	LSAN_OPTIONS=suppressions=$(abspath tests/unit/lsan.supp) EXO_BIN=$(abspath $(BUILD)/exo) \
	    $(BUILD)/unit_tests --jobs 2

integration: $(BUILD)/exo $(CUDA_PLUGIN)
	EXO_BIN=$(abspath $(BUILD)/exo) BUILD=$(BUILD) tests/integration/run.sh

# The sanitizer build runs the unit tests, the end-to-end daemon suite, the
# cluster suite and the download suite (the daemons and their runners under
# ASan+UBSan, driven by the npm clients and the test hub).
# It is built with clang, whose UBSan checks more than GCC's (a zero offset
# applied to a NULL pointer, for one) and whose -Werror warnings differ, so
# the project compiles clean under both.
SAN_CC ?= clang-14
asan:
	$(MAKE) BUILD=build-asan SANITIZE=1 OPT=-O1 CC=$(SAN_CC) unit
	EXO_BIN=$(abspath build-asan/exo) tests/integration/test_e2e_api.sh
	EXO_BIN=$(abspath build-asan/exo) tests/integration/test_cluster.sh
	EXO_BIN=$(abspath build-asan/exo) tests/integration/test_download.sh
	EXO_BIN=$(abspath build-asan/exo) tests/integration/test_e2e_toolcalls.sh
	EXO_BIN=$(abspath build-asan/exo) /usr/bin/python3 tests/integration/test_parity.py

fuzz:
	tests/fuzz/run.sh

# Architecture rules that the compiler cannot check (include layering).
lint:
	/usr/bin/python3 tools/check_layers.py

test: lint unit integration asan fuzz

# Micro-benchmarks: build/bench_<name> from bench/bench_<name>.c.
.PRECIOUS: $(BUILD)/bench/%.o
bench: $(BENCH_SRC:bench/%.c=$(BUILD)/%)
# The whole library goes in: the CUDA plugin calls back into the program
# (logging, errors, the router), which a bench itself may never reference.
$(BUILD)/bench_%: $(BUILD)/bench/bench_%.o $(BUILD)/libexo.a
	$(CC) $(LDFLAGS) -o $@ $< -Wl,--whole-archive $(BUILD)/libexo.a -Wl,--no-whole-archive $(LDLIBS)

clean:
	rm -rf build build-asan build-fuzz

-include $(CUDA_OBJ:.o=.d) $(LIB_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(BUILD)/src/cli/main.d $(BENCH_SRC:%.c=$(BUILD)/%.d)

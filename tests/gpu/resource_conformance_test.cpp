// RMM's resource contract (tests/client/resource_conformance.hpp) for the
// resources that need a GPU: rmmd::ipc_memory_resource in slab and in direct
// mode, and rmmd::pinned_host_memory_resource (page-locking needs CUDA). Each
// skips, saying why, where CUDA sees no GPU. The host kind runs in
// rmmd_integration_tests.

#include "tests/client/resource_conformance.hpp"

namespace rmmd::test {

using gpu_kinds = ::testing::Types<ipc_slab_kind, ipc_direct_kind, pinned_host_kind>;
INSTANTIATE_TYPED_TEST_SUITE_P(Client, ResourceConformance, gpu_kinds, kind_name);

}  // namespace rmmd::test

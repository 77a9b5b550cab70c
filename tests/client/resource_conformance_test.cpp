// RMM's resource contract (resource_conformance.hpp) for the resource that
// needs no GPU: rmmd::host_memory_resource. The GPU kinds run in
// rmmd_gpu_tests (tests/gpu/resource_conformance_test.cpp).

#include "tests/client/resource_conformance.hpp"

namespace rmmd::test {

INSTANTIATE_TYPED_TEST_SUITE_P(Client, ResourceConformance, host_kind, kind_name);

}  // namespace rmmd::test

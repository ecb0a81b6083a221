// The DLPack ABI (https://dmlc.github.io/dlpack/latest/c_api.html), only what Cuvil consumes,
// and the element types Cuvil knows by their IR names.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace cuvil {

namespace dl {
enum DeviceType : int32_t { kCPU = 1, kCPUPinned = 3 };
enum TypeCode : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kBfloat = 4, kBool = 6 };
constexpr uint64_t kFlagReadOnly = 1;

struct Device {
    int32_t device_type;
    int32_t device_id;
};
struct DataType {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
};
struct Tensor {
    void* data;
    Device device;
    int32_t ndim;
    DataType dtype;
    int64_t* shape;
    int64_t* strides;  // null means compact row-major
    uint64_t byte_offset;
};
struct ManagedTensor {
    Tensor dl_tensor;
    void* manager_ctx;
    void (*deleter)(ManagedTensor*);
};
struct Version {
    uint32_t major;
    uint32_t minor;
};
struct ManagedTensorVersioned {
    Version version;
    void* manager_ctx;
    void (*deleter)(ManagedTensorVersioned*);
    uint64_t flags;
    Tensor dl_tensor;
};
}  // namespace dl

// An element type: IR name (f32, i64, ...) and its DLPack code and width.
struct DType {
    std::string name;
    uint8_t code = 0;
    uint8_t bits = 0;
};

std::optional<DType> dtype_from_name(const std::string& name);

}  // namespace cuvil

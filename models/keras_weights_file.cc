#include "models/keras_weights_file.h"

#include <hdf5.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace psrt {
namespace {

ABSL_CONST_INIT absl::Mutex hdf5_mutex(absl::kConstInit);

// Held around every HDF5 call. Turns HDF5's error printing off on each
// acquisition (cheap; a thread-safe HDF5 build keeps the setting per thread).
class Hdf5Lock {
 public:
  Hdf5Lock() : lock_(&hdf5_mutex) { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

 private:
  absl::MutexLock lock_;
};

// Owns an HDF5 identifier (negative: a failed call's result, nothing to
// close) and closes it with the function for its kind.
class Hid {
 public:
  Hid(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Hid() {
    if (id_ >= 0) close_(id_);
  }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;

  bool ok() const { return id_ >= 0; }
  hid_t get() const { return id_; }

 private:
  const hid_t id_;
  herr_t (*const close_)(hid_t);
};

// The innermost message of HDF5's error stack (what the last failed call
// found wrong, in its words), or "".
std::string Hdf5Message() {
  std::string message;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* error, void* out) -> herr_t {
        if (n == 0 && error->desc != nullptr) *static_cast<std::string*>(out) = error->desc;
        return 0;
      },
      &message);
  return message;
}

// An error naming the file, with HDF5's message when an HDF5 call failed.
absl::Status Error(absl::StatusCode code, const std::string& file, absl::string_view what) {
  std::string message = absl::StrCat("Keras weights file ", file, ": ", what);
  const std::string hdf5 = Hdf5Message();
  if (!hdf5.empty()) absl::StrAppend(&message, " (HDF5: ", hdf5, ")");
  return absl::Status(code, message);
}

std::string VarsGroup(const std::string& path) {
  return path.empty() ? "vars" : absl::StrCat(path, "/vars");
}

// The settings every entry is written with.
struct WriteTypes {
  Hid links{H5Pcreate(H5P_LINK_CREATE), H5Pclose};  // Creates intermediate groups.
  Hid string{H5Tcopy(H5T_C_S1), H5Tclose};          // Variable-length UTF-8, as h5py's str.
  Hid scalar{H5Screate(H5S_SCALAR), H5Sclose};

  bool Init() {
    return H5Pset_create_intermediate_group(links.get(), 1) >= 0 &&
           H5Tset_size(string.get(), H5T_VARIABLE) >= 0 &&
           H5Tset_cset(string.get(), H5T_CSET_UTF8) >= 0 && scalar.ok();
  }
};

absl::Status WriteEntry(const std::string& file, hid_t h5, const WriteTypes& types,
                        const KerasWeightsEntry& entry) {
  if (absl::StartsWith(entry.path, "/") || absl::EndsWith(entry.path, "/")) {
    return Error(absl::StatusCode::kInvalidArgument, file,
                 absl::StrCat("path \"", entry.path, "\" has a leading or trailing /"));
  }
  const std::string group_path = VarsGroup(entry.path);
  const Hid group(H5Gcreate2(h5, group_path.c_str(), types.links.get(), H5P_DEFAULT, H5P_DEFAULT),
                  H5Gclose);
  if (!group.ok()) {
    return Error(absl::StatusCode::kInvalidArgument, file,
                 absl::StrCat("cannot create group ", group_path, " (a path given twice?)"));
  }
  const Hid attribute(H5Acreate2(group.get(), "name", types.string.get(), types.scalar.get(),
                                 H5P_DEFAULT, H5P_DEFAULT),
                      H5Aclose);
  const char* name = entry.name.c_str();
  if (!attribute.ok() || H5Awrite(attribute.get(), types.string.get(), &name) < 0) {
    return Error(absl::StatusCode::kInternal, file,
                 absl::StrCat("writing the name attribute of ", group_path));
  }
  for (size_t i = 0; i < entry.vars.size(); ++i) {
    const Tensor& var = entry.vars[i];
    const std::string dataset_name = std::to_string(i);
    const std::vector<hsize_t> dims(var.shape().begin(), var.shape().end());
    const Hid space(var.rank() == 0 ? H5Screate(H5S_SCALAR)
                                    : H5Screate_simple(var.rank(), dims.data(), nullptr),
                    H5Sclose);
    const Hid dataset(H5Dcreate2(group.get(), dataset_name.c_str(), H5T_IEEE_F32LE, space.get(),
                                 H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                      H5Dclose);
    if (!dataset.ok() || (var.num_elements() > 0 &&
                          H5Dwrite(dataset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL,
                                   H5P_DEFAULT, var.data()) < 0)) {
      return Error(absl::StatusCode::kInternal, file,
                   absl::StrCat("writing dataset ", group_path, "/", dataset_name));
    }
  }
  return absl::OkStatus();
}

// The file's bytes, built in memory (HDF5's core driver, nothing on disk).
absl::StatusOr<std::string> BuildImage(const std::string& file,
                                       absl::Span<const KerasWeightsEntry> entries) {
  Hdf5Lock lock;
  WriteTypes types;
  const Hid access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  constexpr size_t kIncrement = size_t{1} << 20;  // The in-memory file grows by this.
  if (!types.Init() || H5Pset_fapl_core(access.get(), kIncrement, /*backing_store=*/false) < 0) {
    return Error(absl::StatusCode::kInternal, file, "setting up HDF5");
  }
  const Hid h5(H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get()), H5Fclose);
  if (!h5.ok()) return Error(absl::StatusCode::kInternal, file, "creating the file in memory");
  for (const KerasWeightsEntry& entry : entries) {
    RETURN_IF_ERROR(WriteEntry(file, h5.get(), types, entry));
  }
  const ssize_t size = H5Fflush(h5.get(), H5F_SCOPE_LOCAL) < 0
                           ? -1
                           : H5Fget_file_image(h5.get(), nullptr, 0);
  std::string image(size > 0 ? size : 0, '\0');
  if (size <= 0 || H5Fget_file_image(h5.get(), image.data(), image.size()) != size) {
    return Error(absl::StatusCode::kInternal, file, "taking the file's image");
  }
  return image;
}

// H5Lvisit's callback: collects the paths of the groups named "vars".
herr_t CollectVarsGroups(hid_t root, const char* path, const H5L_info_t* info, void* groups) {
  const absl::string_view name(path);
  if (info->type != H5L_TYPE_HARD || (name != "vars" && !absl::EndsWith(name, "/vars"))) return 0;
  const Hid object(H5Oopen(root, path, H5P_DEFAULT), H5Oclose);
  if (!object.ok()) return -1;
  if (H5Iget_type(object.get()) == H5I_GROUP) {
    static_cast<std::vector<std::string>*>(groups)->push_back(path);
  }
  return 0;
}

// A dataset of a file of `file_bytes` bytes.
absl::StatusOr<Tensor> ReadVar(const std::string& file, int64_t file_bytes, hid_t group,
                               const std::string& name, const std::string& path) {
  const Hid dataset(H5Dopen2(group, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dataset.ok()) {
    return Error(absl::StatusCode::kInvalidArgument, file, absl::StrCat(path, " is not a dataset"));
  }
  const Hid type(H5Dget_type(dataset.get()), H5Tclose);
  const Hid space(H5Dget_space(dataset.get()), H5Sclose);
  if (!type.ok() || !space.ok()) {
    return Error(absl::StatusCode::kDataLoss, file, absl::StrCat("reading dataset ", path));
  }
  // Integers (a Normalization's int64 count) are read as floats.
  const H5T_class_t kind = H5Tget_class(type.get());
  if (kind != H5T_INTEGER && (kind != H5T_FLOAT || H5Tget_size(type.get()) != sizeof(float))) {
    return Error(absl::StatusCode::kInvalidArgument, file,
                 absl::StrCat("dataset ", path, " is not float32 (or an integer)"));
  }
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0 || H5Sget_simple_extent_type(space.get()) == H5S_NULL) {
    return Error(absl::StatusCode::kInvalidArgument, file,
                 absl::StrCat("dataset ", path, " has no shape"));
  }
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  Shape shape(dims.begin(), dims.end());
  if (!CheckedNumElements(shape).ok()) {
    return Error(absl::StatusCode::kInvalidArgument, file,
                 absl::StrCat("dataset ", path, " is too large"));
  }
  // A damaged shape must not make us allocate what the file cannot hold:
  // stored as it is (Keras's, h5py's default), the data is in the file;
  // chunked (perhaps compressed), at most 64 times its bytes.
  const uint64_t bytes = static_cast<uint64_t>(NumElements(shape)) * H5Tget_size(type.get());
  const Hid plist(H5Dget_create_plist(dataset.get()), H5Pclose);
  const bool chunked = plist.ok() && H5Pget_layout(plist.get()) == H5D_CHUNKED;
  if (chunked ? bytes > 64 * static_cast<uint64_t>(file_bytes)
              : bytes > 0 && (H5Dget_storage_size(dataset.get()) < bytes ||
                              bytes > static_cast<uint64_t>(file_bytes))) {
    return Error(absl::StatusCode::kDataLoss, file,
                 absl::StrCat("dataset ", path, " has shape ", ShapeToString(shape),
                              ", more than the file holds: a damaged file"));
  }
  Tensor var(std::move(shape));
  if (var.num_elements() > 0 &&
      H5Dread(dataset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, var.data()) < 0) {
    return Error(absl::StatusCode::kDataLoss, file, absl::StrCat("reading dataset ", path));
  }
  return var;
}

absl::StatusOr<KerasWeightsEntry> ReadEntry(const std::string& file, int64_t file_bytes,
                                            hid_t h5, const std::string& group_path) {
  KerasWeightsEntry entry;
  entry.path = group_path == "vars" ? "" : group_path.substr(0, group_path.size() - 5);
  // A saveable's path has no "vars" in it: vars groups hold datasets only.
  for (absl::string_view part : absl::StrSplit(entry.path, '/')) {
    if (part == "vars") {
      return Error(absl::StatusCode::kInvalidArgument, file,
                   absl::StrCat("group ", group_path, " lies inside another vars group"));
    }
  }
  const Hid group(H5Gopen2(h5, group_path.c_str(), H5P_DEFAULT), H5Gclose);
  H5G_info_t info;
  if (!group.ok() || H5Gget_info(group.get(), &info) < 0) {
    return Error(absl::StatusCode::kDataLoss, file, absl::StrCat("reading group ", group_path));
  }
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const std::string name = std::to_string(i);
    const std::string path = absl::StrCat(group_path, "/", name);
    // nlinks members, each of 0..nlinks-1 present: exactly those.
    if (H5Lexists(group.get(), name.c_str(), H5P_DEFAULT) <= 0) {
      return Error(absl::StatusCode::kInvalidArgument, file,
                   absl::StrCat("group ", group_path, " holds ", info.nlinks,
                                " members but not the datasets 0..", info.nlinks - 1, " (no ",
                                path, ")"));
    }
    ASSIGN_OR_RETURN(Tensor var, ReadVar(file, file_bytes, group.get(), name, path));
    entry.vars.push_back(std::move(var));
  }
  return entry;
}

}  // namespace

absl::Status WriteKerasWeights(const std::string& file,
                               absl::Span<const KerasWeightsEntry> entries) {
  ASSIGN_OR_RETURN(const std::string image, BuildImage(file, entries));
  return WriteFileAtomically(file, image);
}

absl::StatusOr<std::vector<KerasWeightsEntry>> ReadKerasWeights(const std::string& file) {
  // HDF5 says only "unable to open file" for a missing one.
  struct stat st;
  if (stat(file.c_str(), &st) != 0) {
    return errno == ENOENT
               ? absl::NotFoundError(absl::StrCat("Keras weights file ", file, ": no such file"))
               : Error(absl::StatusCode::kInvalidArgument, file, std::strerror(errno));
  }
  Hdf5Lock lock;
  const Hid h5(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!h5.ok()) {
    return Error(absl::StatusCode::kDataLoss, file, "not an HDF5 file, or a damaged one");
  }
  std::vector<std::string> groups;
  if (H5Lvisit(h5.get(), H5_INDEX_NAME, H5_ITER_INC, CollectVarsGroups, &groups) < 0) {
    return Error(absl::StatusCode::kDataLoss, file, "listing its groups");
  }
  std::vector<std::string> sorted = groups;
  std::sort(sorted.begin(), sorted.end());
  if (auto twice = std::adjacent_find(sorted.begin(), sorted.end()); twice != sorted.end()) {
    return Error(absl::StatusCode::kDataLoss, file,
                 absl::StrCat("group ", *twice, " is listed twice: a damaged file"));
  }
  std::vector<KerasWeightsEntry> entries;
  for (const std::string& group : groups) {
    ASSIGN_OR_RETURN(KerasWeightsEntry entry, ReadEntry(file, st.st_size, h5.get(), group));
    entries.push_back(std::move(entry));
  }
  return entries;
}

}  // namespace psrt

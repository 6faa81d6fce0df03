// Internal to models/: the graph that NetBuilder (net.h) builds and the
// model that runs it (net_model.cc), kept apart so that each file has one
// job: net.cc checks and wires layers, net_model.cc runs a training step.
#ifndef PSRT_MODELS_NET_GRAPH_H_
#define PSRT_MODELS_NET_GRAPH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "models/layers.h"
#include "models/model.h"
#include "models/net.h"

namespace psrt {

struct NetBuilder::Graph {
  struct Node {
    std::unique_ptr<Layer> layer;  // Null for the input.
    std::vector<int> inputs;
    Dims dims;
    std::string what;  // For error messages.
    int consumers = 0;
    // The node's own variables: [var_begin, var_end) of `variables`.
    int var_begin = 0;
    int var_end = 0;
  };
  std::vector<Node> nodes;
  std::vector<VariableDef> variables;
  std::vector<VariableInit> inits;
  int64_t non_trainable = 0;  // Model::num_non_trainable().
};

// The model of a finished graph, on its device: its layers run forward in
// node order and backward in reverse (net_model.cc).
std::unique_ptr<Model> NewNetModel(const ModelOptions& options,
                                   NetBuilder::Graph graph,
                                   std::unique_ptr<kernels::Device> device);

}  // namespace psrt

#endif  // PSRT_MODELS_NET_GRAPH_H_

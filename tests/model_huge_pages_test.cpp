// move_to_huge_pages (model/huge_pages.h): the moved tensors keep their bits, views and sharing;
// the new memory is on 2 MiB pages where the kernel's transparent huge pages allow it; a model's
// weights moved give the same logits.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "model/huge_pages.h"
#include "model/quantize_model.h"
#include "support/tiny_model.h"

namespace coconut {
namespace {

// A setting of the kernel's transparent huge pages (the bracketed choice of the file under
// /sys/kernel/mm/transparent_hugepage): "enabled" is "always", "madvise" or "never"; "defrag" says
// whether a fault in an advised region may compact memory to find a huge page ("always",
// "defer+madvise", "madvise") or falls back to 4 KiB pages at once ("defer", "never").
std::string huge_page_setting(const std::string& name) {
  std::ifstream file("/sys/kernel/mm/transparent_hugepage/" + name);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const auto open = text.find('['), close = text.find(']');
  return open == std::string::npos || close == std::string::npos ? "" : text.substr(open + 1, close - open - 1);
}

TEST(HugePages, MovedTensorsKeepTheirBitsViewsAndSharing) {
  torch::manual_seed(5);
  auto big = torch::randn({1 << 20});                    // 4 MiB
  auto view = big.narrow(0, 1000, 5000);                 // shares big's storage
  auto small = torch::randint(0, 256, {77}, torch::kUInt8);
  const auto big_before = big.clone(), small_before = small.clone();
  const void* big_was = big.data_ptr();
  const int64_t moved = move_to_huge_pages({big, view, small, torch::Tensor(), torch::empty({0})});
  EXPECT_EQ(moved, (4 << 20) + 128);  // each storage once, each on a 64-byte boundary
  EXPECT_NE(big.data_ptr(), big_was);
  EXPECT_TRUE(torch::equal(big, big_before));
  EXPECT_TRUE(torch::equal(small, small_before));
  EXPECT_EQ(view.data_ptr<float>(), big.data_ptr<float>() + 1000);
  big[1500] = 42.0f;  // the view still reads the storage's new memory
  EXPECT_EQ(view[500].item<float>(), 42.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data_ptr()) % (2 << 20), 0u);  // the mapping starts on a huge page
  const std::string mode = huge_page_setting("enabled"), defrag = huge_page_setting("defrag");
  const bool advised_faults_compact = defrag == "always" || defrag == "defer+madvise" || defrag == "madvise";
  if (mode == "never") {
    EXPECT_EQ(huge_page_bytes_of_mapping(big.data_ptr()), 0);
  } else if ((mode == "always" || mode == "madvise") && advised_faults_compact) {  // the pages were written after the advice
    EXPECT_GE(huge_page_bytes_of_mapping(big.data_ptr()), 2 << 20) << "transparent huge pages " << mode << ", defrag " << defrag;
  }
  // Off by the environment: nothing moves.
  setenv("COCONUT_HUGE_PAGES", "off", 1);
  const void* small_at = small.data_ptr();
  EXPECT_EQ(move_to_huge_pages({small}), 0);
  unsetenv("COCONUT_HUGE_PAGES");
  EXPECT_EQ(small.data_ptr(), small_at);
}

TEST(HugePages, AModelsMovedWeightsGiveTheSameLogits) {
  LlamaConfig config;  // widths of a multiple of 32, as the blocks need
  config.hidden_size = 64;
  config.intermediate_size = 128;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.vocab_size = 300;
  config.max_position_embeddings = 64;
  config.validate();
  torch::NoGradGuard no_grad;
  const auto ids = torch::tensor(std::vector<int64_t>{1, 5, 3, 9, 0, 7, 200, 6}).view({1, -1});
  for (const bool quantized : {false, true}) {
    SCOPED_TRACE(quantized ? "q8_0" : "dense");
    auto model = testing::tiny_model(config);
    if (quantized)
      model = with_quantized_weights(model, WeightFormat::kQ8_0);
    else
      pack_for_inference(model);
    const auto before = model->logits(model->forward_ids(ids).hidden);
    std::vector<const void*> was;
    for (const auto& tensor : held_weight_tensors(model)) was.push_back(tensor.data_ptr());
    const int64_t moved = move_to_huge_pages(held_weight_tensors(model));
    EXPECT_GT(moved, 0);
    const auto tensors = held_weight_tensors(model);
    const auto* first = static_cast<const char*>(tensors.front().data_ptr());
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].numel() == 0) continue;
      EXPECT_NE(tensors[i].data_ptr(), was[i]) << "tensor " << i;
      const auto* at = static_cast<const char*>(tensors[i].data_ptr());
      EXPECT_LT(std::abs(at - first), moved) << "tensor " << i << " outside the one mapping";
    }
    EXPECT_TRUE(torch::equal(model->logits(model->forward_ids(ids).hidden), before));
  }
}

}  // namespace
}  // namespace coconut

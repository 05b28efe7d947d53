// `tandem convert`: writes the repacked-expert cache and says where; a second run finds it valid
// (mapped, no repacking); a corrupt cache is rebuilt; bad arguments fail with a clear message.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

TEST(CliConvert, WritesThenFindsTheCacheAndRebuildsACorruptOne) {
  test::TempDir dir("cli_convert");
  const fs::path model = dir / "mixtral.gguf";
  fs::copy_file(test::data_path("golden/mixtral.gguf"), model);
  const std::string args =
      "convert -m " + model.string() + " --cpu-experts int8 --expert-group 64 --threads 2";
  const fs::path cache = dir / "mixtral.gguf.tandem-int8-g64.bin";

  test::CommandResult r = test::run_tandem(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("wrote int8 experts"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(cache.string()), std::string::npos) << r.out;
  ASSERT_TRUE(fs::exists(cache));
  std::ifstream in(cache, std::ios::binary);
  char magic[8] = {};
  in.read(magic, 8);
  EXPECT_EQ(std::string(magic, 8), "TDMXPAK1");

  r = test::run_tandem(args);  // valid: mapped, not repacked
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("up to date:"), std::string::npos) << r.out;

  {
    std::fstream f(cache, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f.write("XXXX", 4);
  }
  r = test::run_tandem(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("wrote int8 experts"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("stale or corrupt"), std::string::npos) << r.err;

  // -o: an exact file.
  const fs::path out = dir / "elsewhere.bin";
  r = test::run_tandem("convert -m " + model.string() + " --cpu-experts int4 -o " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(out.string()), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(out));
}

TEST(CliConvert, BadArguments) {
  const std::string model = test::data_path("golden/deepseek2.gguf").string();
  test::CommandResult r = test::run_tandem("convert -m " + model + " --cpu-experts fp4");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("fp4"), std::string::npos) << r.err;
  r = test::run_tandem("convert -m " + model + " --cpu-experts native");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("nothing to convert"), std::string::npos) << r.err;
  // Expert rows of 64 values do not take groups of 128 (checked before anything is written).
  r = test::run_tandem("convert -m " + model + " --cpu-experts int4 --expert-group 128");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--expert-group 128"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tandem

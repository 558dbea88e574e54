// The field readers config.cpp and config_v4.cpp share: each names the field in its ConfigError.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "hmla/model/config.h"

namespace hmla::cfg {

// Optional fields (absent or null: `def`), checked for their JSON type and range of int64.
int64_t get_int(const nlohmann::json& j, const char* key, int64_t def, const std::string& what);
double get_num(const nlohmann::json& j, const char* key, double def, const std::string& what);
bool get_bool(const nlohmann::json& j, const char* key, bool def, const std::string& what);
// A required integer >= 1.
int64_t need_positive(const nlohmann::json& j, const char* key, const std::string& what);
// An optional string field with one accepted value.
void check_only(const nlohmann::json& j, const char* key, const char* value, const std::string& what, const char* why);
// One RoPE parameters object (rope_type default or yarn, YaRN's fields checked) over `r`'s values;
// `f` names it in messages. rope_theta's range is the caller's to check.
RopeConfig parse_rope_params(const nlohmann::json& p, RopeConfig r, const std::string& f);
// The config's rope_parameters, else its legacy rope_scaling (field names which), else null.
const nlohmann::json* rope_object(const nlohmann::json& j, const char** field);
// quantization_config (FP8) and num_nextn_predict_layers (absent: 0).
CheckpointForm parse_checkpoint_form(const nlohmann::json& j, const std::string& what);
// A deepseek_v4 config (config_v4.cpp).
ModelConfig parse_v4_fields(const nlohmann::json& j, const std::string& what, LayerModesFrom modes);
// Its checks, also after set_all_modes.
void validate_v4(const ModelConfig& c, const std::string& what);

}  // namespace hmla::cfg

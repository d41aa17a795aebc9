//! The command line's names for the core types it takes as option values
//! (`--kv`, `--chat`, `--type`, `--q4-scale`): clap's `ValueEnum` for each,
//! from the names, help and aliases the types keep themselves, so that
//! clap stays in `app/`.

use clap::builder::PossibleValue;
use clap::ValueEnum;

use crate::chat::Template;
use crate::import::quantize::Q4Rule;
use crate::import::ConvertType;
use crate::model::KvType;

/// `ValueEnum` for a type with `ALL`, `name()` and `help()` (and `aliases()` where given).
macro_rules! value_enum {
    ($t:ty) => {
        value_enum!($t, |_: &$t| -> &'static [&'static str] { &[] });
    };
    ($t:ty, $aliases:expr) => {
        impl ValueEnum for $t {
            fn value_variants<'a>() -> &'a [Self] {
                &<$t>::ALL
            }

            fn to_possible_value(&self) -> Option<PossibleValue> {
                Some(PossibleValue::new(self.name()).help(self.help()).aliases($aliases(self).iter().copied()))
            }
        }
    };
}

value_enum!(KvType, |t: &KvType| t.aliases());
value_enum!(Template);
value_enum!(ConvertType);
value_enum!(Q4Rule);

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value clap accepts is the one whose name it is (aliases too).
    #[test]
    fn names_parse_back() {
        for t in KvType::ALL {
            assert_eq!(KvType::from_str(t.name(), false), Ok(t));
        }
        assert_eq!(KvType::from_str("q8_0", false), Ok(KvType::Q8));
        for t in Template::ALL {
            assert_eq!(Template::from_str(t.name(), false), Ok(t));
        }
        for t in ConvertType::ALL {
            assert_eq!(ConvertType::from_str(t.name(), false), Ok(t));
        }
        for t in Q4Rule::ALL {
            assert_eq!(Q4Rule::from_str(t.name(), false), Ok(t));
        }
    }
}

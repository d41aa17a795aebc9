//! Checks that a release executable is self-contained and stripped, with the
//! `object` crate:
//!
//! * ELF: no `PT_INTERP` (no dynamic loader) and no `DT_NEEDED` (no shared
//!   library), i.e. static or static-pie; no `.symtab`.
//! * PE: imports only DLLs that every Windows (10 and later) has — no
//!   `libgcc_s_seh-1.dll`, `libwinpthread-1.dll` or other MinGW runtime
//!   DLLs; no COFF symbol table.

use object::pe::ImageNtHeaders64;
use object::read::elf::{Dyn, ElfFile, FileHeader, ProgramHeader};
use object::read::pe::ImageNtHeaders;
use object::{Endianness, FileKind, Object};

/// DLLs a Windows executable may import: they ship with the OS.
const WINDOWS_SYSTEM_DLLS: &[&str] = &[
    "kernel32.dll",
    "kernelbase.dll",
    "ntdll.dll",
    "msvcrt.dll",
    "ucrtbase.dll",
    "advapi32.dll",
    "bcrypt.dll",
    "bcryptprimitives.dll",
    "userenv.dll",
    "ws2_32.dll",
    "synchronization.dll",
    "shell32.dll",
    "ole32.dll",
    "user32.dll",
    // the chat's line editor (rustyline) reads the clipboard's bitmap formats
    // through clipboard-win; GDI ships with every Windows and user32 loads it anyway
    "gdi32.dll",
    "secur32.dll",
];

fn system_dll(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.starts_with("api-ms-win-") || WINDOWS_SYSTEM_DLLS.contains(&lower.as_str())
}

/// Ok(description) when `data` is a static, stripped executable; Err(why not).
pub fn check(data: &[u8]) -> Result<String, String> {
    match FileKind::parse(data).map_err(|e| format!("not an object file: {e}"))? {
        FileKind::Elf64 => check_elf::<object::elf::FileHeader64<Endianness>>(data),
        FileKind::Elf32 => check_elf::<object::elf::FileHeader32<Endianness>>(data),
        FileKind::Pe64 => check_pe(data),
        other => Err(format!("unexpected file kind {other:?}")),
    }
}

fn check_elf<Elf: FileHeader<Endian = Endianness>>(data: &[u8]) -> Result<String, String> {
    let elf = ElfFile::<Elf>::parse(data).map_err(|e| format!("bad ELF: {e}"))?;
    let endian = elf.endian();
    let mut needed = 0;
    let mut pie = false;
    for ph in elf.elf_program_headers() {
        match ph.p_type(endian) {
            object::elf::PT_INTERP => {
                let interp = ph
                    .interpreter(endian, data)
                    .ok()
                    .flatten()
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .unwrap_or_default();
                return Err(format!("dynamically linked: PT_INTERP {interp}"));
            }
            object::elf::PT_DYNAMIC => {
                pie = true;
                if let Some(dyns) = ph.dynamic(endian, data).map_err(|e| format!("bad PT_DYNAMIC: {e}"))? {
                    needed += dyns.iter().filter(|d| d.d_tag(endian) == object::elf::DT_NEEDED).count();
                }
            }
            _ => {}
        }
    }
    if needed > 0 {
        return Err(format!("needs {needed} shared libraries (DT_NEEDED)"));
    }
    if elf.section_by_name(".symtab").is_some() {
        return Err("not stripped (has .symtab)".into());
    }
    let machine = format!("{:?}", elf.architecture()).to_lowercase();
    Ok(format!("ELF {machine}, {}, stripped", if pie { "static-pie" } else { "static" }))
}

fn check_pe(data: &[u8]) -> Result<String, String> {
    let pe = object::read::pe::PeFile64::parse(data).map_err(|e| format!("bad PE: {e}"))?;
    let mut dlls: Vec<String> = Vec::new();
    for import in pe.imports().map_err(|e| format!("bad import table: {e}"))? {
        let import = import.map_err(|e| format!("bad import: {e}"))?;
        let lib = String::from_utf8_lossy(import.library()).into_owned();
        if !dlls.iter().any(|d| d.eq_ignore_ascii_case(&lib)) {
            dlls.push(lib);
        }
    }
    let foreign: Vec<&String> = dlls.iter().filter(|d| !system_dll(d)).collect();
    if !foreign.is_empty() {
        return Err(format!("imports non-system DLLs: {foreign:?}"));
    }
    let nt: &ImageNtHeaders64 = pe.nt_headers();
    let symtab = nt.file_header().pointer_to_symbol_table.get(object::LittleEndian);
    if symtab != 0 {
        return Err("not stripped (has a COFF symbol table)".into());
    }
    dlls.sort_by_key(|d| d.to_ascii_lowercase());
    Ok(format!("PE, system DLLs only ({}), stripped", dlls.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_executable_is_rejected() {
        // This test binary is an ordinary dynamically linked executable.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let err = check(&me).unwrap_err();
        assert!(err.contains("PT_INTERP") || err.contains("DT_NEEDED"), "{err}");
    }

    #[test]
    fn system_dlls() {
        assert!(system_dll("KERNEL32.dll") && system_dll("api-ms-win-core-synch-l1-2-0.dll"));
        assert!(!system_dll("libgcc_s_seh-1.dll") && !system_dll("libwinpthread-1.dll"));
    }

    #[test]
    fn garbage_is_rejected() {
        assert!(check(b"#!/bin/sh\necho hi\n").is_err());
    }
}
